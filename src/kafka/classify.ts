// kafkajs reports failures in several shapes: a protocol error with a `type`, wrapped in
// KafkaJSNumberOfRetriesExceeded after its own retries, sometimes inside a KafkaJSAggregateError
// when a batch went to several brokers. We walk the whole chain and decide: is this message to
// blame (count an attempt against its row), or is the broker/network down (stop, blame no row)?
import { BrokerUnavailableError, DeadlineExceededError, MessageRejectedError, type RelayError } from '../errors.ts';

/** errors about the records themselves: retrying the same bytes can never succeed */
const RECORD_ERRORS = new Set(['MESSAGE_TOO_LARGE', 'RECORD_LIST_TOO_LARGE', 'INVALID_RECORD', 'CORRUPT_MESSAGE']);
/** errors about the destination topic: every message to that topic fails, no other topic is affected */
const TOPIC_ERRORS = new Set(['UNKNOWN_TOPIC_OR_PARTITION', 'INVALID_TOPIC_EXCEPTION', 'TOPIC_AUTHORIZATION_FAILED', 'POLICY_VIOLATION']);

interface Chainable {
  type?: unknown;
  name?: unknown;
  message?: unknown;
  cause?: unknown;
  originalError?: unknown;
  errors?: unknown;
}

export function errorTypes(err: unknown, seen = new Set<unknown>()): string[] {
  if (!err || typeof err !== 'object' || seen.has(err)) return [];
  seen.add(err);
  const e = err as Chainable;
  const out: string[] = [];
  if (typeof e.type === 'string') out.push(e.type);
  if (typeof e.name === 'string') out.push(e.name);
  for (const next of [e.cause, e.originalError]) out.push(...errorTypes(next, seen));
  if (Array.isArray(e.errors)) for (const x of e.errors) out.push(...errorTypes(x, seen));
  return out;
}

export type SendFailure =
  | { scope: 'record'; error: MessageRejectedError }
  | { scope: 'topic'; error: MessageRejectedError }
  | { scope: 'broker'; error: RelayError };

export function classifySendError(err: unknown, topic: string): SendFailure {
  if (err instanceof DeadlineExceededError) return { scope: 'broker', error: err };
  const types = errorTypes(err);
  const record = types.find((t) => RECORD_ERRORS.has(t));
  if (record) {
    return { scope: 'record', error: new MessageRejectedError(`broker rejected the message (${record}) on topic ${topic}`, record !== 'CORRUPT_MESSAGE', { cause: err }) };
  }
  const topicType = types.find((t) => TOPIC_ERRORS.has(t));
  if (topicType) {
    const hint =
      topicType === 'UNKNOWN_TOPIC_OR_PARTITION'
        ? 'the topic does not exist and auto-creation is off: create it, or fix the row\'s topic / OUTBOX_TOPIC_TEMPLATE'
        : topicType === 'TOPIC_AUTHORIZATION_FAILED'
          ? 'the relay\'s principal may not write to it: grant WRITE on the topic'
          : 'fix the topic name';
      return { scope: 'topic', error: new MessageRejectedError(`cannot publish to topic ${topic} (${topicType}): ${hint}`, false, { cause: err }) };
  }
  const message = err instanceof Error ? err.message : String(err);
  return { scope: 'broker', error: new BrokerUnavailableError(`broker unavailable: ${message}`, { cause: err }) };
}

export function isSaslAuthError(err: unknown): boolean {
  return errorTypes(err).some((t) => t === 'KafkaJSSASLAuthenticationError' || t === 'SASL_AUTHENTICATION_FAILED');
}
