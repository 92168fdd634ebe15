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
//
// And RDS IAM authentication (`iam`): the proxy answers each client's startup itself, asks for a
// cleartext password, accepts only a valid RDS IAM auth token for its host, port and user
// (rds-token.ts: the SigV4 signature recomputed with the emulator's credentials, the expiry, the
// action, the user), refuses anything else as RDS does (FATAL 28P01, with the reason), and only
// then logs in to the real server with the real password (SCRAM-SHA-256, MD5 or cleartext, as the
// server asks) and forwards everything from the server's AuthenticationOk on.
import { createHash, createHmac, pbkdf2Sync, randomBytes } from 'node:crypto';
import net from 'node:net';
import { verifyRdsAuthToken, type TokenExpectation, type TokenFacts } from './rds-token.ts';

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

/** The IAM login the proxy demands (startPgProxy's `iam`): a token for `host` and the proxy's own port. */
export interface PgProxyIam extends Omit<TokenExpectation, 'now' | 'user' | 'port'> {
  /** the real login upstream, once a client's token is valid */
  upstream: { user: string; password: string };
  /** the proxy's clock (ms), against which tokens expire; default Date.now */
  now?: () => number;
  /** how long to wait before asking the n-th connection (from 0) for its password; default none */
  askDelayMs?: (n: number) => number;
}

/** One IAM login attempt, as the proxy saw it. */
export interface PgProxyLogin {
  /** the user of the startup message */
  user: string;
  /** when the proxy asked for the password (ms) */
  askedAt: number;
  token: string;
  /** the token's facts when it was accepted */
  facts?: TokenFacts;
  /** why it was refused */
  refused?: string;
}

export interface PgProxy {
  port: number;
  /** with `iam`: every login attempt, in order */
  readonly logins: readonly PgProxyLogin[];
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
export async function startPgProxy(opts: {
  listenPort: number;
  targetPort: number;
  onStatement?: (text: string, connection: PgProxyConnection) => void | 'drop';
  iam?: PgProxyIam;
}): Promise<PgProxy> {
  const open = new Set<net.Socket>();
  let cut = false;
  let cutMessages = 0;
  const logins: PgProxyLogin[] = [];
  let connections = 0;
  const server = net.createServer((client) => {
    open.add(client);
    if (!opts.iam) {
      pipe(client, net.connect({ port: opts.targetPort, host: '127.0.0.1' }), { started: false });
      return;
    }
    const iam = opts.iam;
    client.on('error', () => client.destroy());
    iamLogin(client, { ...iam, port: (server.address() as net.AddressInfo).port }, connections++, logins, opts.targetPort).then(
      (done) => {
        if (done) pipe(client, done.upstream, { started: true, clientBytes: done.clientBytes, upstreamBytes: done.upstreamBytes });
      },
      () => client.destroy(),
    );
  });

  /** Forwards both ways, reporting statements; `started`: the startup was dealt with already (IAM), `*Bytes` what was read past it. */
  function pipe(client: net.Socket, upstream: net.Socket, init: { started: boolean; clientBytes?: Buffer; upstreamBytes?: Buffer }): void {
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
    const fromUpstream = (d: Buffer) => {
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
    };
    upstream.on('data', fromUpstream);
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
    let started = init.started;
    let pending: Buffer = Buffer.alloc(0);
    const fromClient = (chunk: Buffer) => {
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
          verdict = opts.onStatement?.(portalText, connection);
        } else if (type === 'Q') {
          verdict = opts.onStatement?.(cstring(msg, 5)[0], connection);
        }
        if (verdict === 'drop') {
          closeBoth();
          return;
        }
        forward(msg);
      }
    };
    client.on('data', fromClient);
    if (init.upstreamBytes?.length) fromUpstream(init.upstreamBytes);
    if (init.clientBytes?.length) fromClient(init.clientBytes);
  }

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.listenPort, '127.0.0.1', () => {
      server.off('error', reject);
      resolve();
    });
  });
  return {
    port: (server.address() as net.AddressInfo).port,
    logins,
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

/** Reads whole protocol messages from a socket, until detached. */
class MessageReader {
  private buf: Buffer = Buffer.alloc(0);
  private wake: (() => void) | undefined;
  private closed = false;
  private readonly onData = (d: Buffer) => {
    this.buf = Buffer.concat([this.buf, d]);
    this.wake?.();
  };
  private readonly onClose = () => {
    this.closed = true;
    this.wake?.();
  };

  constructor(private readonly socket: net.Socket) {
    socket.on('data', this.onData).on('close', this.onClose);
  }

  private async need(n: number): Promise<void> {
    while (this.buf.length < n) {
      if (this.closed) throw new Error('the connection closed');
      await new Promise<void>((resolve) => (this.wake = resolve));
    }
  }

  private take(n: number): Buffer {
    const out = this.buf.subarray(0, n);
    this.buf = this.buf.subarray(n);
    return out;
  }

  /** A startup packet: an int32 length that counts itself, no type byte. */
  async startup(): Promise<Buffer> {
    await this.need(4);
    const len = this.buf.readInt32BE(0);
    await this.need(len);
    return this.take(len);
  }

  /** A type byte and an int32 length that counts itself. */
  async message(): Promise<Buffer> {
    await this.need(5);
    const len = 1 + this.buf.readInt32BE(1);
    await this.need(len);
    return this.take(len);
  }

  /** Stop reading; what was read past the last message. */
  detach(): Buffer {
    this.socket.off('data', this.onData).off('close', this.onClose);
    return this.buf;
  }
}

const SSL_REQUEST_CODE = 80877103;

/** A message of `type` whose body is `body`. */
function message(type: string, body: Buffer): Buffer {
  const head = Buffer.alloc(5);
  head.write(type, 0, 'latin1');
  head.writeInt32BE(4 + body.length, 1);
  return Buffer.concat([head, body]);
}

const z = (s: string) => Buffer.from(`${s}\0`, 'utf8');

/** What RDS answers a refused IAM login with: FATAL 28P01, the reason in the message. */
function refusal(text: string): Buffer {
  return message('E', Buffer.concat([z('SFATAL'), z('VFATAL'), z('C28P01'), z(`M${text}`), Buffer.from([0])]));
}

/** The startup packet's parameters (after its length and protocol version). */
function startupParams(packet: Buffer): Map<string, string> {
  const params = new Map<string, string>();
  let at = 8;
  while (at < packet.length && packet[at] !== 0) {
    const [key, next] = cstring(packet, at);
    const [value, after] = cstring(packet, next);
    params.set(key, value);
    at = after;
  }
  return params;
}

function startupPacket(params: Map<string, string>): Buffer {
  const body = Buffer.concat([...[...params].flatMap(([k, v]) => [z(k), z(v)]), Buffer.from([0])]);
  const head = Buffer.alloc(8);
  head.writeInt32BE(8 + body.length, 0);
  head.writeInt32BE(196608, 4); // protocol 3.0
  return Buffer.concat([head, body]);
}

/**
 * The client's IAM login, then the real one upstream. Resolves with the upstream connection once
 * the server said AuthenticationOk (its bytes from that message on, and the client's read past its
 * password), or undefined when the login was refused (the client has been told why).
 */
async function iamLogin(client: net.Socket, iam: PgProxyIam & { port: number }, n: number, logins: PgProxyLogin[], targetPort: number): Promise<{ upstream: net.Socket; clientBytes: Buffer; upstreamBytes: Buffer } | undefined> {
  const now = iam.now ?? Date.now;
  const fromClient = new MessageReader(client);
  let startup = await fromClient.startup();
  if (startup.length === 8 && startup.readInt32BE(4) === SSL_REQUEST_CODE) {
    client.write('N'); // no TLS here: the client goes on in plaintext or gives up
    startup = await fromClient.startup();
  }
  const params = startupParams(startup);
  const user = params.get('user') ?? '';
  const delay = iam.askDelayMs?.(n) ?? 0;
  if (delay > 0) await new Promise((r) => setTimeout(r, delay));
  const askedAt = now();
  client.write(message('R', Buffer.from([0, 0, 0, 3]))); // AuthenticationCleartextPassword
  const answer = await fromClient.message();
  // anything but a PasswordMessage (a Terminate from a client that is closing): no login attempt
  if (answer[0] !== 0x70 /* p */) {
    client.destroy();
    return undefined;
  }
  const token = cstring(answer, 5)[0];
  const verdict = verifyRdsAuthToken(token, { ...iam, user, now: now() });
  if (!verdict.ok) {
    logins.push({ user, askedAt, token, refused: verdict.reason });
    client.end(refusal(`IAM authentication failed for user "${user}": ${verdict.reason}`));
    return undefined;
  }
  logins.push({ user, askedAt, token, facts: verdict.facts });

  const upstream = net.connect({ port: targetPort, host: '127.0.0.1' });
  upstream.on('error', () => client.destroy());
  const fromServer = new MessageReader(upstream);
  params.set('user', iam.upstream.user);
  upstream.write(startupPacket(params));
  const scram = { nonce: randomBytes(18).toString('base64'), serverFirst: '' };
  for (;;) {
    const m = await fromServer.message();
    if (m[0] === 0x45 /* E */) {
      client.end(m);
      upstream.destroy();
      return undefined;
    }
    if (m[0] !== 0x52 /* R */) throw new Error(`unexpected message ${String.fromCharCode(m[0]!)} before AuthenticationOk`);
    const kind = m.readInt32BE(5);
    if (kind === 0) return { upstream, clientBytes: fromClient.detach(), upstreamBytes: Buffer.concat([m, fromServer.detach()]) };
    upstream.write(upstreamAuth(kind, m, iam.upstream, scram));
  }
}

/** The answer to the server's authentication request `kind` (3 cleartext, 5 MD5, 10-12 SCRAM-SHA-256), with the real password. */
function upstreamAuth(kind: number, m: Buffer, login: PgProxyIam['upstream'], scram: { nonce: string; serverFirst: string }): Buffer {
  if (kind === 3) return message('p', z(login.password));
  if (kind === 5) {
    const md5 = (s: string | Buffer) => createHash('md5').update(s).digest('hex');
    return message('p', z(`md5${md5(Buffer.concat([Buffer.from(md5(login.password + login.user)), m.subarray(9, 13)]))}`));
  }
  if (kind === 10) {
    const first = Buffer.from(`n,,n=*,r=${scram.nonce}`);
    const len = Buffer.alloc(4);
    len.writeInt32BE(first.length);
    return message('p', Buffer.concat([z('SCRAM-SHA-256'), len, first]));
  }
  if (kind === 11) {
    scram.serverFirst = m.toString('utf8', 9);
    const f = new Map(scram.serverFirst.split(',').map((kv) => [kv[0]!, kv.slice(2)]));
    const salted = pbkdf2Sync(login.password, Buffer.from(f.get('s') ?? '', 'base64'), Number(f.get('i')), 32, 'sha256');
    const clientKey = createHmac('sha256', salted).update('Client Key').digest();
    const storedKey = createHash('sha256').update(clientKey).digest();
    const withoutProof = `c=biws,r=${f.get('r') ?? ''}`;
    const authMessage = `n=*,r=${scram.nonce},${scram.serverFirst},${withoutProof}`;
    const signature = createHmac('sha256', storedKey).update(authMessage).digest();
    const proof = Buffer.from(clientKey.map((b, i) => b ^ signature[i]!));
    return message('p', Buffer.from(`${withoutProof},p=${proof.toString('base64')}`));
  }
  if (kind === 12) return Buffer.alloc(0); // SASLFinal: AuthenticationOk follows
  throw new Error(`the server asks for authentication ${kind}, which the test proxy does not speak`);
}
