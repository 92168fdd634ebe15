// The loop talks to Kafka only through this interface, so another client (e.g. a librdkafka
// binding) can be added without touching the loop.
import type { Deadline } from '../budget.ts';
import type { MessageRejectedError, RelayError } from '../errors.ts';
import type { OutboundMessage } from './message.ts';

export interface PublishOutcome {
  /** seqs the broker acknowledged with acks=all: the only rows that may be marked sent */
  acked: string[];
  /** seqs rejected for a reason tied to the message or its topic: counted as an attempt */
  rejected: Array<{ seq: string; error: MessageRejectedError }>;
  /** set when the broker or network failed as a whole; rows neither acked nor rejected stay pending */
  unavailable?: RelayError;
}

export interface Publisher {
  /** Publish in order; messages with the same key keep their relative order. Never throws for send failures. */
  publish(messages: OutboundMessage[], deadline: Deadline): Promise<PublishOutcome>;
  /** Largest message the broker accepts on `topic`, in bytes (cached). */
  maxMessageBytes(topic: string, deadline: Deadline): Promise<number>;
  /** Connections opened since the publisher was created (warm invocations must not add any). */
  readonly connects: number;
  close(): Promise<void>;
}
