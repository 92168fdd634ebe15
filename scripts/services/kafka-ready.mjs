// Health check for the local broker, used by scripts/services.sh: succeeds once the broker
// answers a metadata request through kafkajs (the client the relay uses), not merely once the
// port is open. Optionally creates topics that must exist (auto-create is off on purpose).
//
//   node scripts/services/kafka-ready.mjs [--brokers 127.0.0.1:9092] [--timeout-ms 60000]
//                                         [--ensure-topic NAME[:PARTITIONS]]... [--warm-up]
//
// --warm-up (used right after the broker starts): also asks for a producer id (InitProducerId,
// what every idempotent producer does first) and finds a group coordinator, so the broker loads
// or creates __transaction_state and __consumer_offsets now. Otherwise the first client after a
// (re)start gets COORDINATOR_LOAD_IN_PROGRESS / COORDINATOR_NOT_AVAILABLE, which kafkajs logs as
// errors and retries: a relay with a small retry budget could fail its first invocation.
import { Kafka, logLevel } from 'kafkajs';

const args = process.argv.slice(2);
let brokers = ['127.0.0.1:9092'];
let timeoutMs = 60_000;
const ensure = [];
let warmUp = false;
for (let i = 0; i < args.length; i++) {
  const a = args[i];
  const v = args[i + 1];
  if (a === '--brokers' && v) (brokers = v.split(',')), i++;
  else if (a === '--timeout-ms' && v) (timeoutMs = Number(v)), i++;
  else if (a === '--ensure-topic' && v) {
    const [topic, partitions] = v.split(':');
    ensure.push({ topic, numPartitions: Number(partitions ?? 3), replicationFactor: 1 });
    i++;
  } else if (a === '--warm-up') warmUp = true;
  else {
    console.error(`kafka-ready: unknown argument ${a}`);
    process.exit(2);
  }
}

const deadline = Date.now() + timeoutMs;
const kafka = new Kafka({
  clientId: 'services-health',
  brokers,
  connectionTimeout: 2_000,
  requestTimeout: 5_000,
  retry: { retries: 0 },
  logLevel: logLevel.NOTHING,
});

let lastError = 'no attempt made';
while (Date.now() < deadline) {
  const admin = kafka.admin();
  try {
    await admin.connect();
    const topics = await admin.listTopics();
    const missing = ensure.filter((t) => !topics.includes(t.topic));
    if (missing.length > 0) {
      await admin.createTopics({ topics: missing, waitForLeaders: true });
      console.log(`kafka-ready: created ${missing.map((t) => t.topic).join(', ')}`);
    }
    if (warmUp) {
      const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1, retry: { retries: 5, initialRetryTime: 200 } });
      await producer.connect(); // InitProducerId
      await producer.disconnect();
      await admin.describeGroups(['services-health-warm-up']); // FindCoordinator(GROUP)
    }
    await admin.disconnect();
    process.exit(0);
  } catch (err) {
    // TOPIC_ALREADY_EXISTS can race with another `up`; anything else: retry until the deadline
    if (err?.type === 'TOPIC_ALREADY_EXISTS') {
      await admin.disconnect().catch(() => {});
      process.exit(0);
    }
    lastError = `${err?.name ?? 'Error'}: ${err?.message ?? err}`;
    await admin.disconnect().catch(() => {});
    await new Promise((r) => setTimeout(r, 500));
  }
}
console.error(`kafka-ready: ${brokers.join(',')} did not answer a metadata request within ${timeoutMs} ms (last error: ${lastError})`);
process.exit(1);
