import net from 'node:net';

/**
 * `n` distinct ports free on 127.0.0.1 now. Each is held until all are chosen: a port taken and
 * released one at a time can be handed out again to the next ask (two listeners of one private
 * broker were once given the same port so, and the broker refused to start).
 */
export async function freePorts(n: number): Promise<number[]> {
  const servers: net.Server[] = [];
  try {
    for (let i = 0; i < n; i++) {
      const server = net.createServer();
      servers.push(server);
      await new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen(0, '127.0.0.1', resolve);
      });
    }
    return servers.map((s) => (s.address() as net.AddressInfo).port);
  } finally {
    await Promise.all(servers.map((s) => new Promise((resolve) => s.close(resolve))));
  }
}
