// A Postgres-protocol-aware TCP proxy for integration tests: it forwards everything unchanged and
// reports each statement as it passes on to the server, in the order the client sent them. With
// the Kafka proxy's onProduceRequest in the same process, a test sees whether a batch's COMMIT
// reached the database before the next batch's records reached the broker (G2), without relying
// on two clocks.
//
// Frontend protocol: the startup packet has no type byte (int32 length, then the rest); every
// later message is a type byte and an int32 length that counts itself. postgres.js uses the
// extended protocol: Parse ('P': statement name, query text), Bind ('B': portal, statement name),
// Execute ('E'). A prepared statement is parsed once per connection and later only bound by name,
// so the proxy remembers each connection's statement texts. Simple queries are 'Q'.
import net from 'node:net';

export interface PgProxy {
  port: number;
  close(): Promise<void>;
}

function cstring(buf: Buffer, at: number): [string, number] {
  const end = buf.indexOf(0, at);
  return [buf.toString('utf8', at, end), end + 1];
}

/**
 * `onStatement` hears each statement as it passes; when it returns 'drop', the statement is not
 * forwarded and the connection is closed, as a network fault or a pooler that refuses it would.
 */
export async function startPgProxy(opts: { listenPort: number; targetPort: number; onStatement: (text: string) => void | 'drop' }): Promise<PgProxy> {
  const open = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const upstream = net.connect({ port: opts.targetPort, host: '127.0.0.1' });
    open.add(client).add(upstream);
    const closeBoth = () => {
      client.destroy();
      upstream.destroy();
      open.delete(client);
      open.delete(upstream);
    };
    client.on('error', closeBoth).on('close', closeBoth);
    upstream.on('error', closeBoth).on('close', closeBoth);
    upstream.on('data', (d: Buffer) => client.write(d));

    const statements = new Map<string, string>(); // prepared statement name → text
    let portalText = '';
    let started = false;
    let pending: Buffer = Buffer.alloc(0);
    client.on('data', (chunk: Buffer) => {
      pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk]);
      for (;;) {
        if (!started) {
          if (pending.length < 4) break;
          const len = pending.readInt32BE(0);
          if (pending.length < len) break;
          upstream.write(pending.subarray(0, len));
          pending = pending.subarray(len);
          started = true;
          continue;
        }
        if (pending.length < 5) break;
        const end = 1 + pending.readInt32BE(1);
        if (pending.length < end) break;
        const msg = pending.subarray(0, end);
        pending = pending.subarray(end);
        const type = String.fromCharCode(msg[0]!);
        let verdict: void | 'drop' = undefined;
        if (type === 'P') {
          const [name, next] = cstring(msg, 5);
          statements.set(name, cstring(msg, next)[0]);
        } else if (type === 'B') {
          const [, next] = cstring(msg, 5);
          portalText = statements.get(cstring(msg, next)[0]) ?? '';
        } else if (type === 'E') {
          verdict = opts.onStatement(portalText);
        } else if (type === 'Q') {
          verdict = opts.onStatement(cstring(msg, 5)[0]);
        }
        if (verdict === 'drop') {
          closeBoth();
          return;
        }
        upstream.write(msg);
      }
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.listenPort, '127.0.0.1', () => {
      server.off('error', reject);
      resolve();
    });
  });
  return {
    port: (server.address() as net.AddressInfo).port,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of open) s.destroy();
        server.close(() => resolve());
      }),
  };
}
