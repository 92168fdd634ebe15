// Typed errors. Every error the relay raises says what is wrong and what to do, and carries
// `retriable`: whether trying again later (next invocation) can succeed without a human.

export abstract class RelayError extends Error {
  abstract readonly retriable: boolean;
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** Bad or missing configuration. Not retriable: fix the environment and redeploy. */
export class ConfigError extends RelayError {
  readonly retriable = false;
  constructor(readonly problems: string[]) {
    super(`invalid configuration:\n  - ${problems.join('\n  - ')}`);
  }
}

/** A secret could not be fetched or does not have the expected shape. Never contains the value. */
export class SecretError extends RelayError {
  readonly retriable: boolean;
  constructor(readonly secretId: string, reason: string, options?: { cause?: unknown; retriable?: boolean }) {
    super(`secret ${JSON.stringify(secretId)}: ${reason}`, options);
    this.retriable = options?.retriable ?? false;
  }
}

/** The database refused or could not be reached. */
export class DatabaseError extends RelayError {
  readonly retriable: boolean;
  constructor(message: string, options?: { cause?: unknown; retriable?: boolean }) {
    super(message, options);
    this.retriable = options?.retriable ?? true;
  }
}

/** The broker or the network failed as a whole: no row is to blame, the invocation stops. */
export class BrokerUnavailableError extends RelayError {
  readonly retriable = true;
}

/**
 * A send failed with an error the relay does not recognise. Handled like an unavailable broker
 * (the invocation stops, no row is charged), because charging rows for an error we cannot place
 * could park good rows; but named apart, so nobody reads it as "the broker is down".
 */
export class UnexpectedKafkaError extends RelayError {
  readonly retriable = true;
}

/**
 * The configured Kafka client's module could not be imported (it is loaded on first use,
 * src/kafka/clients.ts): a deployment missing part of the bundle, or a missing dependency.
 * Handled like an unavailable broker (the invocation stops, no row is charged), named apart.
 */
export class KafkaClientLoadError extends RelayError {
  readonly retriable = false;
  constructor(client: string, cause: unknown) {
    super(
      `the Kafka client ${client} (OUTBOX_KAFKA_CLIENT) could not be loaded: ${describe(cause)}; deploy the whole zip scripts/build.mjs makes (handler.mjs with its chunks/ directory), or run npm ci where the relay runs from source`,
      { cause },
    );
  }
}

/**
 * No Amazon MSK IAM token could be signed (KAFKA_AUTH=iam): no AWS credentials found, or no
 * region. Handled like credentials the broker refused (classify.ts, scope auth): the invocation
 * stops, no row is charged. Retriable: on Lambda the role's credentials come from the runtime,
 * and a failure to get them can pass.
 */
export class MskIamError extends RelayError {
  readonly retriable = true;
}

/** One message could not be published for a reason tied to that message (size, topic, ACL). */
export class MessageRejectedError extends RelayError {
  readonly retriable = true;
  constructor(
    message: string,
    /** park at once instead of backing off: retrying can never succeed (e.g. too large). */
    readonly permanent = false,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/**
 * Exactly-once delivery: this invocation no longer holds its lane (docs/DESIGN.md, "Exactly-once delivery (opt-in)"). Its lease
 * ran out (the invocation was paused past it) or another invocation settled its batch; it commits
 * nothing more, in Kafka or in the database, and the lane's holder delivers its rows.
 */
export class LaneLostError extends RelayError {
  readonly retriable = true;
}

/**
 * Exactly-once delivery: a batch's Kafka transaction aborted before its commit was asked for (the
 * lane's offset refused), so none of it is ever visible. `refused`: the topic, when the broker
 * refused it as a whole (deleted since the send): backed off like any refused topic.
 */
export class TransactionAbortedError extends RelayError {
  readonly retriable = true;
  constructor(
    readonly failure: RelayError,
    readonly refused?: { topic: string; error: MessageRejectedError },
  ) {
    super(`the Kafka transaction was aborted before its commit: ${failure.message}`, { cause: failure });
  }
}

/** An await did not finish within the invocation's remaining budget. */
export class DeadlineExceededError extends RelayError {
  readonly retriable = true;
  constructor(what: string) {
    super(`${what} did not finish before the invocation's deadline`);
  }
}

export function describe(err: unknown): string {
  if (err instanceof Error) return err.message;
  return String(err);
}
