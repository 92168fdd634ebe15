// Both clients report the broker's own error code by its name, in different shapes, and we walk
// the whole chain for it:
//   kafkajs      a protocol error with a `type`, wrapped in KafkaJSNumberOfRetriesExceeded after
//                its own retries, sometimes inside a KafkaJSAggregateError (several brokers)
//   platformatic a ProtocolError with an `apiId`, inside a ResponseError's `errors` (one per
//                refused partition), inside MultipleErrors (one per retry, one per broker); its
//                own failures carry a `code` (PLT_KFK_NETWORK, PLT_KFK_AUTHENTICATION, ...)
// and decide the failure's scope, which decides what happens to the rows (see Publisher):
//   record   the bytes of one record can never be accepted: charge that row an attempt
//   topic    every send to this topic fails, other topics are fine: back the topic off, charge no row
//   producer the producer's idempotence state (id, epoch, sequences) no longer matches the
//            broker's, or the request was damaged on its way (CORRUPT_MESSAGE): a new producer,
//            the same records once more, charge no row
//   auth     the broker refused our credentials (rotated): read the secret again, reconnect, retry once
//   broker   the broker or the network is down or too slow: stop the invocation, charge no row
import type { KafkaAuth } from '../config/types.ts';
import { BrokerUnavailableError, DeadlineExceededError, KafkaClientLoadError, MessageRejectedError, MskIamError, UnexpectedKafkaError, type RelayError } from '../errors.ts';
import { tlsRefusal } from '../transport.ts';

/** errors about the records themselves: retrying the same bytes can never succeed */
// INVALID_TIMESTAMP: a record timestamp (OUTBOX_METADATA=timestamp: created_at) outside the topic's
// message.timestamp.before/after.max.ms: the row is parked at once, an operator's to retry
const RECORD_ERRORS = new Set(['MESSAGE_TOO_LARGE', 'RECORD_LIST_TOO_LARGE', 'INVALID_RECORD', 'INVALID_TIMESTAMP']);
/** errors about the destination topic: every message to that topic fails, no other topic is affected */
const TOPIC_ERRORS = new Set([
  'UNKNOWN_TOPIC_OR_PARTITION',
  'UNKNOWN_TOPIC_ID',
  'INCONSISTENT_TOPIC_ID',
  'INVALID_TOPIC_EXCEPTION',
  'TOPIC_AUTHORIZATION_FAILED',
  'TOPIC_DELETION_DISABLED',
  'POLICY_VIOLATION',
  // kafkajs' own: the metadata it refreshed has no partitions for the topic (deleted meanwhile)
  'KafkaJSTopicMetadataNotLoaded',
]);
/** errors about the idempotent producer's state on the broker (sequence numbers, id, epoch) */
const PRODUCER_ERRORS = new Set([
  'OUT_OF_ORDER_SEQUENCE_NUMBER',
  'UNKNOWN_PRODUCER_ID',
  'INVALID_PRODUCER_EPOCH',
  'DUPLICATE_SEQUENCE_NUMBER',
  'INVALID_PRODUCER_ID_MAPPING',
  'PRODUCER_FENCED',
]);
/**
 * A request the broker found damaged (code 2: its CRC check failed): the bytes were corrupted on
 * the wire, not written wrong by us, since the client computed that CRC over them. Retriable in
 * the Java client, kafkajs and platformatic alike. Handled as the producer scope: a new producer
 * encodes the same records again, once; no row is charged (if it fails again, as the broker).
 */
const CORRUPT_REQUEST_ERRORS = new Set(['CORRUPT_MESSAGE']);
const AUTH_ERRORS = new Set(['KafkaJSSASLAuthenticationError', 'SASL_AUTHENTICATION_FAILED', 'PLT_KFK_AUTHENTICATION']);
/** the broker or the network, not our records: down, unreachable, too slow, or moving leaders */
const BROKER_ERRORS = new Set([
  'KafkaJSConnectionError',
  'KafkaJSConnectionClosedError',
  'KafkaJSRequestTimeoutError',
  'KafkaJSBrokerNotFound',
  'KafkaJSNoBrokerAvailableError',
  'KafkaJSMetadataNotLoaded',
  'KafkaJSTimeout',
  'KafkaJSLockTimeout',
  // platformatic's: connection refused, closed or timed out (its timeouts carry this code too)
  'PLT_KFK_NETWORK',
  'PLT_KFK_TIMEOUT',
  'NOT_LEADER_FOR_PARTITION',
  'NOT_LEADER_OR_FOLLOWER',
  'LEADER_NOT_AVAILABLE',
  'NOT_ENOUGH_REPLICAS',
  'NOT_ENOUGH_REPLICAS_AFTER_APPEND',
  'REQUEST_TIMED_OUT',
  'NETWORK_EXCEPTION',
  'BROKER_NOT_AVAILABLE',
  'KAFKA_STORAGE_ERROR',
  'THROTTLING_QUOTA_EXCEEDED',
  'CLUSTER_AUTHORIZATION_FAILED',
]);

// platformatic answers a Metadata response's UNKNOWN_TOPIC_OR_PARTITION (a topic deleted, or never
// created) with a UserError of its own, without the broker's error as cause (clients/base/base.js,
// 2.12): its message is all that is left of the code. Pinned version; the unit test builds the
// error as the library does, and the topic-deleted integration test fails if this stops matching.
const PLATFORMATIC_UNKNOWN_TOPIC = /^Unknown topic .*\.$/;

interface Chainable {
  type?: unknown;
  apiId?: unknown;
  code?: unknown;
  name?: unknown;
  message?: unknown;
  cause?: unknown;
  originalError?: unknown;
  errors?: unknown;
}

/** `err` and every error it wraps (cause, kafkajs' originalError, an aggregate's errors), depth first, each once. */
function errorChain(err: unknown, seen = new Set<unknown>()): Chainable[] {
  if (!err || typeof err !== 'object' || seen.has(err)) return [];
  seen.add(err);
  const e = err as Chainable;
  const nested = [e.cause, e.originalError, ...(Array.isArray(e.errors) ? (e.errors as unknown[]) : [])];
  return [e, ...nested.flatMap((next) => errorChain(next, seen))];
}

export function errorTypes(err: unknown): string[] {
  return errorChain(err).flatMap((e) => {
    const out: string[] = [];
    if (typeof e.type === 'string') out.push(e.type);
    if (typeof e.apiId === 'string') out.push(e.apiId);
    if (typeof e.name === 'string') out.push(e.name);
    // kafkajs' `code` is the broker's number; a string one is platformatic's own (or Node's, ECONNRESET)
    if (typeof e.code === 'string') out.push(e.code);
    if (e.code === 'PLT_KFK_USER' && typeof e.message === 'string' && PLATFORMATIC_UNKNOWN_TOPIC.test(e.message)) out.push('UNKNOWN_TOPIC_OR_PARTITION');
    return out;
  });
}

export type SendFailure =
  | { scope: 'record'; code: string; error: MessageRejectedError }
  | { scope: 'topic'; code: string; error: MessageRejectedError }
  | { scope: 'producer'; code: string; error: BrokerUnavailableError }
  | { scope: 'auth'; code: string; error: BrokerUnavailableError | MskIamError }
  | { scope: 'broker'; error: RelayError };

export type SendScope = SendFailure['scope'];

const TOPIC_HINTS: Record<string, string> = {
  UNKNOWN_TOPIC_OR_PARTITION: "the topic does not exist (or was deleted) and auto-creation is off: create it, or fix the row's topic / OUTBOX_TOPIC_TEMPLATE",
  KafkaJSTopicMetadataNotLoaded: "the broker has no partitions for the topic (deleted?): create it, or fix the row's topic / OUTBOX_TOPIC_TEMPLATE",
  TOPIC_AUTHORIZATION_FAILED: "the relay's principal may not write to it: grant WRITE on the topic",
};

/** What to check when the broker refused the relay's login, by KAFKA_AUTH. */
const AUTH_HINTS: Record<KafkaAuth, string> = {
  sasl: "Kafka refused the relay's credentials (%s): check KAFKA_SECRET_ID's username, password and mechanism, and the principal's ACLs",
  none: "Kafka asked the relay to log in (%s), and KAFKA_AUTH=none gives no credentials: point KAFKA_BROKERS at the listener you mean, or set KAFKA_AUTH (sasl with KAFKA_SECRET_ID, or iam)",
  iam:
    "Kafka refused the relay's MSK IAM token (%s): check that the relay's AWS credentials (on Lambda the function's role) may kafka-cluster:Connect to the cluster (docs/DEPLOY.md, MSK), " +
    "that AWS_REGION is the cluster's region, that KAFKA_BROKERS names the cluster's IAM listener (port 9098; 9198 over public access), and that this machine's clock is right (a token is valid for 15 minutes from its signing)",
};

/** The MskIamError in the chain, if any: a token that could not be signed, wherever a client wrapped it. */
function mskIamError(err: unknown): MskIamError | undefined {
  return errorChain(err).find((e): e is MskIamError => e instanceof MskIamError);
}

export function classifySendError(err: unknown, topic: string, auth: KafkaAuth = 'sasl'): SendFailure {
  // already ours, and saying what is wrong: passed on as they are
  if (err instanceof DeadlineExceededError || err instanceof KafkaClientLoadError) return { scope: 'broker', error: err };
  // no token could be signed: as refused credentials, saying why
  const unsigned = mskIamError(err);
  if (unsigned) return { scope: 'auth', code: 'MSK_IAM_SIGNING', error: unsigned };
  // a certificate refused: a setting to change, not a broker to wait for
  const refused = errorChain(err).map((e) => tlsRefusal(e, 'broker')).find(Boolean);
  if (refused) return { scope: 'broker', error: new BrokerUnavailableError(refused, { cause: err }) };
  const types = errorTypes(err);
  const message = err instanceof Error ? err.message : String(err);
  // the order matters: a SASL failure during a reconnect can be wrapped with the retried error
  const authType = types.find((t) => AUTH_ERRORS.has(t));
  if (authType) {
    return { scope: 'auth', code: authType, error: new BrokerUnavailableError(AUTH_HINTS[auth].replace('%s', authType), { cause: err }) };
  }
  const record = types.find((t) => RECORD_ERRORS.has(t));
  if (record) {
    return { scope: 'record', code: record, error: new MessageRejectedError(`broker rejected the message (${record}) on topic ${topic}`, true, { cause: err }) };
  }
  const topicType = types.find((t) => TOPIC_ERRORS.has(t));
  if (topicType) {
    const hint = TOPIC_HINTS[topicType] ?? 'fix the topic name or its configuration';
    return { scope: 'topic', code: topicType, error: new MessageRejectedError(`cannot publish to topic ${topic} (${topicType}): ${hint}`, false, { cause: err }) };
  }
  const producer = types.find((t) => PRODUCER_ERRORS.has(t));
  if (producer) {
    return { scope: 'producer', code: producer, error: new BrokerUnavailableError(`the broker refused the producer's state (${producer}) on topic ${topic}: ${message}`, { cause: err }) };
  }
  const corrupt = types.find((t) => CORRUPT_REQUEST_ERRORS.has(t));
  if (corrupt) {
    return { scope: 'producer', code: corrupt, error: new BrokerUnavailableError(`the broker found the request corrupt (${corrupt}) on topic ${topic}, damaged on its way: ${message}`, { cause: err }) };
  }
  if (types.some((t) => BROKER_ERRORS.has(t))) return { scope: 'broker', error: new BrokerUnavailableError(`broker unavailable: ${message}`, { cause: err }) };
  const seen = types.filter((t) => t !== 'Error').join(' < ') || 'no error type';
  return {
    scope: 'broker',
    error: new UnexpectedKafkaError(`Kafka send failed with an error the relay does not recognise (${seen}): ${message}; handled like an unavailable broker: the invocation stops, no row is charged`, { cause: err }),
  };
}

export function isSaslAuthError(err: unknown): boolean {
  return errorTypes(err).some((t) => AUTH_ERRORS.has(t));
}
