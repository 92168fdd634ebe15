// The loop talks to Kafka only through this interface, so another client (e.g. a librdkafka
// binding) can be added without touching the loop.
import type { Deadline } from '../budget.ts';
import type { MessageRejectedError, RelayError } from '../errors.ts';
import type { OutboundMessage } from './message.ts';

export interface PublishOutcome {
  /** seqs the broker acknowledged with acks=all: the only rows that may be marked sent */
  acked: string[];
  /** seqs rejected for a reason tied to the message itself (size, invalid record): counted as an attempt */
  rejected: Array<{ seq: string; error: MessageRejectedError }>;
  /**
   * topics the broker refused as a whole (unknown, deleted, not authorized): their unacked rows
   * stay pending without an attempt charged, and the invocation sends nothing more to them
   */
  backedOff: Array<{ topic: string; error: MessageRejectedError }>;
  /** set when the broker or network failed as a whole; rows neither acked nor rejected stay pending */
  unavailable?: RelayError;
}

export interface Publisher {
  /** Publish in order; messages with the same key keep their relative order. Never throws for send failures. */
  publish(messages: OutboundMessage[], deadline: Deadline): Promise<PublishOutcome>;
  /** Largest message the broker accepts on `topic`, in bytes (cached). */
  maxMessageBytes(topic: string, deadline: Deadline): Promise<number>;
  /**
   * Producers connected since the publisher was created, each with a producer id of its own: warm
   * invocations without failures add none, every failed send adds one (the failed one is discarded).
   */
  readonly connects: number;
  close(): Promise<void>;
}
