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
//
// Two faults for the crash tests: a connection's answers held back (the server has executed what
// it received, the client has not heard of it), and the way to the server cut for every connection
// at once (what the server has received by then is all a process killed at that instant sent).
import net from 'node:net';

/** One client connection, as onStatement sees it. */
export interface PgProxyConnection {
  /** From now on, what the server sends this client is kept here, not forwarded (a COMMIT executed, its answer not received). */
  holdAnswers(): void;
  /** Forward what was held, and stop holding. */
  releaseAnswers(): void;
  /** bytes of the server's answers held back so far */
  readonly heldBytes: number;
  /** the command tags (CommandComplete: `SELECT 5`, `COMMIT`, ...) among the answers held back so far: what the server has done */
  readonly heldCommands: readonly string[];
}

export interface PgProxy {
  port: number;
  /**
   * From now on nothing any client sends reaches the server: the moment a process is killed, as
   * far as the database can tell. What was forwarded before stays forwarded.
   */
  cutToServer(): void;
  /** messages from clients that cutToServer() kept from the server */
  readonly cutMessages: number;
  close(): Promise<void>;
}

function cstring(buf: Buffer, at: number): [string, number] {
  const end = buf.indexOf(0, at);
  return [buf.toString('utf8', at, end), end + 1];
}

/**
 * `onStatement` hears each statement as it passes, with its connection, before it is forwarded;
 * when it returns 'drop', the statement is not forwarded and the connection is closed, as a
 * network fault or a pooler that refuses it would.
 */
export async function startPgProxy(opts: { listenPort: number; targetPort: number; onStatement: (text: string, connection: PgProxyConnection) => void | 'drop' }): Promise<PgProxy> {
  const open = new Set<net.Socket>();
  let cut = false;
  let cutMessages = 0;
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
    // the server's messages, whole (a type byte and an int32 length that counts itself, from the
    // first byte: no SSL), so that what is held starts and ends at a message's boundary
    let held: Buffer[] | undefined;
    let heldBytes = 0;
    const heldCommands: string[] = [];
    let answers: Buffer = Buffer.alloc(0);
    upstream.on('data', (d: Buffer) => {
      answers = answers.length === 0 ? d : Buffer.concat([answers, d]);
      let end = 0;
      while (answers.length >= end + 5 && answers.length >= end + 1 + answers.readInt32BE(end + 1)) {
        const next = end + 1 + answers.readInt32BE(end + 1);
        if (held) {
          const msg = answers.subarray(end, next);
          held.push(msg);
          heldBytes += msg.length;
          if (msg[0] === 0x43 /* C: CommandComplete */) heldCommands.push(cstring(msg, 5)[0]);
        }
        end = next;
      }
      // whole messages pass in one write, as they came (many small writes would meet Nagle's delay)
      if (!held && end > 0) client.write(answers.subarray(0, end));
      answers = answers.subarray(end);
    });
    const connection: PgProxyConnection = {
      holdAnswers: () => void (held ??= []),
      releaseAnswers: () => {
        const out = held ?? [];
        held = undefined;
        for (const d of out) if (!client.destroyed) client.write(d);
      },
      get heldBytes() {
        return heldBytes;
      },
      heldCommands,
    };
    const forward = (bytes: Buffer, messages = 1) => {
      if (cut) cutMessages += messages;
      else upstream.write(bytes);
    };

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
          forward(pending.subarray(0, len));
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
          verdict = opts.onStatement(portalText, connection);
        } else if (type === 'Q') {
          verdict = opts.onStatement(cstring(msg, 5)[0], connection);
        }
        if (verdict === 'drop') {
          closeBoth();
          return;
        }
        forward(msg);
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
    cutToServer: () => void (cut = true),
    get cutMessages() {
      return cutMessages;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of open) s.destroy();
        server.close(() => resolve());
      }),
  };
}
