// OUTBOX_KAFKA_CLIENT → the client library a Publisher uses. Everything else about publishing is
// the same for both (producer-publisher.ts).
//
// A client's module, and the library with it, is imported on first use (an invocation starting,
// or a producer connecting), never when this module is: a Lambda cold start then parses only the
// configured library (kafkajs is ~280 KB of the minified bundle, @platformatic/kafka and its
// dependencies ~760 KB), which scripts/build.mjs puts in chunks of their own.
// docs/benchmarks/cold-start.md measured what that saves.
import type { Config, KafkaClientName } from '../config/types.ts';
import { KafkaClientLoadError } from '../errors.ts';
import type { Logger } from '../log.ts';
import { ProducerPublisher, type KafkaClient, type PublisherOptions } from './producer-publisher.ts';
import { LanePublisher, type TransactionalKafkaClient } from './transactional.ts';

type ClientLoader = (kafka: Config['kafka'], logger: Logger) => Promise<KafkaClient & TransactionalKafkaClient>;

/** Each client's module (a dynamic import: a chunk of its own in the bundle). */
const CLIENT_MODULES = {
  kafkajs: () => import('./kafkajs.ts'),
  platformatic: () => import('./platformatic.ts'),
} satisfies Record<KafkaClientName, () => Promise<unknown>>;

/** Each client, its module imported on first use. */
export const CLIENT_LOADERS: Record<KafkaClientName, ClientLoader> = {
  kafkajs: async (kafka, logger) => new (await CLIENT_MODULES.kafkajs()).KafkajsClient(kafka, logger),
  platformatic: async (kafka) => new (await CLIENT_MODULES.platformatic()).PlatformaticClient(kafka),
};

/**
 * Starts importing the client's module, ahead of its first connect: Runtime.invoke does it as an
 * invocation starts, so that a cold start parses the library while it waits on the database and
 * the secrets. A failure is left to the connect, which reports it (KafkaClientLoadError).
 */
export function preloadKafkaClient(client: KafkaClientName): void {
  CLIENT_MODULES[client]().catch(() => undefined);
}

/**
 * The configured client (`kafka.client`). Its module is imported at the first connect, once; an
 * import that fails is a KafkaClientLoadError (the invocation stops, no row is charged), and the
 * next connect tries again.
 */
export function kafkaClient(kafka: Config['kafka'], logger: Logger, load: ClientLoader = CLIENT_LOADERS[kafka.client]): KafkaClient & TransactionalKafkaClient {
  let loading: Promise<KafkaClient & TransactionalKafkaClient> | undefined;
  const loaded = () =>
    (loading ??= load(kafka, logger).catch((err: unknown) => {
      loading = undefined;
      throw new KafkaClientLoadError(kafka.client, err);
    }));
  return {
    connect: async (login) => (await loaded()).connect(login),
    connectTransactional: async (login, transactionalId, transactionTimeoutMs) => (await loaded()).connectTransactional(login, transactionalId, transactionTimeoutMs),
  };
}

/** A lane's publisher (OUTBOX_DELIVERY=exactly-once), its transactional id the lane's. */
export function createLanePublisher(opts: PublisherOptions, transactionalId: string, transactionTimeoutMs: number): LanePublisher {
  return new LanePublisher(opts, kafkaClient(opts.kafka, opts.logger), transactionalId, transactionTimeoutMs);
}

/** The Publisher of the configured client (`opts.kafka.client`). */
export function createPublisher(opts: PublisherOptions): ProducerPublisher {
  return new ProducerPublisher(opts, kafkaClient(opts.kafka, opts.logger));
}
