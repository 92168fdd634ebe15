// Whoever can INSERT into the outbox picks a row's topic and headers, and the relay publishes with
// its own Kafka principal: these rules keep a row to the deployment's topics and keep its headers
// from steering consumers (`__TypeId__` picks the class Spring's JsonDeserializer builds)
// (docs/security.md).
import { RELAY_HEADERS, RESERVED_HEADER_PREFIX, type RowRules } from '../domain.ts';
import { MessageRejectedError } from '../errors.ts';
import type { OutboundMessage } from './ports.ts';

export function brokenRule(message: OutboundMessage, rules: RowRules): MessageRejectedError | undefined {
  if (!message.topic.startsWith(rules.topicPrefix)) {
    return park(
      `topic ${JSON.stringify(message.topic)} breaks the topic-prefix rule: every topic must start with OUTBOX_TOPIC_PREFIX ${JSON.stringify(rules.topicPrefix)}. ` +
        "Fix the row's topic (or aggregatetype); if the relay is meant to write that topic, widen OUTBOX_TOPIC_PREFIX, and the relay's Kafka ACL or IAM policy with it",
    );
  }
  const relay = rules.relayHeaders ?? RELAY_HEADERS;
  const extra = Object.entries(message.headers).filter(([name]) => !relay.includes(name));
  const reserved = extra.find(([name]) => name.startsWith(RESERVED_HEADER_PREFIX) && !rules.reservedHeadersAllowed.includes(name));
  if (reserved) {
    return park(
      `header ${JSON.stringify(reserved[0].slice(0, 100))} breaks the reserved-header rule: names starting with "${RESERVED_HEADER_PREFIX}" are instructions to consumers ` +
        "(Spring's __TypeId__ picks the class a consumer deserializes into). Remove it from the row's headers, or list the name in OUTBOX_HEADERS_ALLOW_RESERVED",
    );
  }
  if (extra.length > rules.maxHeaders) {
    return park(
      `the row's ${extra.length} headers break the header-count rule: at most OUTBOX_HEADERS_MAX_COUNT=${rules.maxHeaders} per row (the relay's own headers not counted). ` +
        'Send fewer headers, or raise OUTBOX_HEADERS_MAX_COUNT',
    );
  }
  const bytes = extra.reduce((sum, [name, value]) => sum + Buffer.byteLength(name) + Buffer.byteLength(value), 0);
  if (bytes > rules.maxHeaderBytes) {
    return park(
      `the row's headers (${bytes} bytes of names and values) break the header-size rule: at most OUTBOX_HEADERS_MAX_BYTES=${rules.maxHeaderBytes} per row (the relay's own headers not counted). ` +
        'Move the data into the payload, or raise OUTBOX_HEADERS_MAX_BYTES',
    );
  }
  return undefined;
}

// permanent: the same row breaks the same rule on every attempt, so it is parked at once
function park(message: string): MessageRejectedError {
  return new MessageRejectedError(message, true);
}
