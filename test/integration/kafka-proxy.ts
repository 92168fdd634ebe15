// A Kafka-protocol-aware TCP proxy for integration tests, to lose a Produce answer: the broker has
// appended the batch, but the client never learns it (the connection dies before the answer
// arrives, or the answer comes late). That is the case where a relay must not mark rows sent yet
// must tolerate the duplicate its retry produces. Killing or pausing the broker cannot show it:
// then the append itself is in doubt.
//
// The local broker has listeners for this (scripts/services/kafka.sh): PROXIED binds 127.0.0.1:9095
// and advertises 127.0.0.1:9096, SASL_PROXIED binds 9097 and advertises 9098. A test starts this
// proxy on 9096 → 9095 (or 9098 → 9097) and bootstraps its client at the proxy; since a Kafka client
// reconnects to the address the metadata names, every connection it makes goes through the proxy.
//
// Kafka framing: every request and response is an int32 (big-endian) size and that many bytes. A
// request header starts int16 api_key, int16 api_version, int32 correlation_id; a response header
// is int32 correlation_id. So the proxy notes correlation_id → api_key from the client's requests
// and, frame by frame, decides what to do with each of the broker's answers.
import net from 'node:net';

const PRODUCE = 0;

export type ProduceAnswers = 'pass' | 'drop' | 'hold';

export interface KafkaProxy {
  port: number;
  /**
   * What happens to answers to Produce requests (api key 0) from now on: 'pass' forwards them,
   * 'drop' swallows the broker's answer and closes that client connection (the broker HAS
   * appended), 'hold' delays the answer (and everything after it on that connection) by holdMs.
   */
  setProduceAnswers(mode: ProduceAnswers, holdMs?: number): void;
  /** number of Produce answers dropped or held so far */
  readonly dropped: number;
  /** number of Produce requests seen so far (passed to the broker whatever the mode) */
  readonly produceRequests: number;
  /** client connections open now */
  readonly connections: number;
  /** destroy every open client and upstream connection now */
  dropAllConnections(): void;
  close(): Promise<void>;
}

/** Calls onFrame with each complete size-prefixed frame of a byte stream, however it is chunked. */
function frameSplitter(onFrame: (frame: Buffer) => void): (chunk: Buffer) => void {
  let pending: Buffer = Buffer.alloc(0);
  return (chunk) => {
    pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk]);
    while (pending.length >= 4) {
      const end = 4 + pending.readInt32BE(0);
      if (pending.length < end) break;
      onFrame(pending.subarray(0, end));
      pending = pending.subarray(end);
    }
  };
}

/**
 * Listens on 127.0.0.1:listenPort and forwards each connection to host:targetPort
 * (host defaults to 127.0.0.1).
 */
export async function startKafkaProxy(opts: {
  listenPort: number;
  targetPort: number;
  host?: string;
  /** called as each Produce request passes on to the broker (tests that order events across proxies) */
  onProduceRequest?: () => void;
}): Promise<KafkaProxy> {
  let mode: ProduceAnswers = 'pass';
  let holdMs = 0;
  let dropped = 0;
  let produceRequests = 0;
  const open = new Set<{ client: net.Socket; upstream: net.Socket }>();

  const server = net.createServer((client) => {
    const upstream = net.connect({ port: opts.targetPort, host: opts.host ?? '127.0.0.1' });
    const pair = { client, upstream };
    open.add(pair);
    const closeBoth = () => {
      open.delete(pair);
      client.destroy();
      upstream.destroy();
    };
    client.on('error', closeBoth).on('close', closeBoth);
    upstream.on('error', closeBoth).on('close', closeBoth);

    const apiKeyOf = new Map<number, number>(); // correlation_id → api_key, until answered
    client.on(
      'data',
      frameSplitter((frame) => {
        const apiKey = frame.readInt16BE(4);
        if (apiKey === PRODUCE) {
          produceRequests++;
          opts.onProduceRequest?.();
        }
        apiKeyOf.set(frame.readInt32BE(8), apiKey);
        upstream.write(frame);
      }),
    );

    // Answers go out in order through this chain, so a held one also holds back the ones after it
    // (a Kafka connection answers in request order).
    let outgoing = Promise.resolve();
    upstream.on(
      'data',
      frameSplitter((frame) => {
        if (client.destroyed) return;
        const correlationId = frame.readInt32BE(4);
        const apiKey = apiKeyOf.get(correlationId);
        apiKeyOf.delete(correlationId);
        if (apiKey === PRODUCE && mode === 'drop') {
          dropped++;
          closeBoth();
          return;
        }
        const delay = apiKey === PRODUCE && mode === 'hold' ? holdMs : 0;
        if (delay > 0) dropped++;
        outgoing = outgoing.then(async () => {
          if (delay > 0) await new Promise((r) => setTimeout(r, delay));
          if (!client.destroyed) client.write(frame);
        });
      }),
    );
  });

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.listenPort, '127.0.0.1', () => {
      server.off('error', reject);
      resolve();
    });
  });

  const dropAllConnections = () => {
    for (const { client, upstream } of open) {
      client.destroy();
      upstream.destroy();
    }
    open.clear();
  };

  return {
    port: (server.address() as net.AddressInfo).port,
    setProduceAnswers(next, ms = 0) {
      mode = next;
      holdMs = ms;
    },
    get dropped() {
      return dropped;
    },
    get produceRequests() {
      return produceRequests;
    },
    get connections() {
      return open.size;
    },
    dropAllConnections,
    close: () =>
      new Promise<void>((resolve, reject) => {
        dropAllConnections();
        server.close((err) => (err ? reject(err) : resolve()));
      }),
  };
}
