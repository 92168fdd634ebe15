// OUTBOX_KAFKA_CLIENT → the client library a Publisher uses. Everything else about publishing is
// the same for both (producer-publisher.ts).
import type { Config } from '../config.ts';
import type { Logger } from '../log.ts';
import { KafkajsClient } from './kafkajs.ts';
import { PlatformaticClient } from './platformatic.ts';
import { ProducerPublisher, type KafkaClient, type PublisherOptions } from './producer-publisher.ts';

export function kafkaClient(kafka: Config['kafka'], logger: Logger): KafkaClient {
  switch (kafka.client) {
    case 'kafkajs':
      return new KafkajsClient(kafka, logger);
    case 'platformatic':
      return new PlatformaticClient(kafka);
  }
}

/** The Publisher of the configured client (`opts.kafka.client`). */
export function createPublisher(opts: PublisherOptions): ProducerPublisher {
  return new ProducerPublisher(opts, kafkaClient(opts.kafka, opts.logger));
}
