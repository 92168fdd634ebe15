#!/usr/bin/env bash
# Every test, services included: starts (or reuses) the local services, then runs unit, model and
# integration tests with node's built-in runner. Integration files run one at a time because
# some of them stop, pause or kill the shared broker and database connections on purpose.
#
# The integration suite runs once per Kafka client (OUTBOX_KAFKA_CLIENT, set in every fixture
# from TEST_KAFKA_CLIENT): kafkajs, the default, runs every file; platformatic runs every file
# whose relay publishes, and leaves out those that do not depend on the relay's client (the
# services' own checks, the test proxy's, packaging, and partitions.test.ts, which runs both
# clients itself). The guarantee tests then run a third time through the transaction pooler.
set -euo pipefail
cd "$(dirname "$0")/.."

npm run --silent services:up

export KAFKAJS_NO_PARTITIONER_WARNING=1
run_tests() {
  node --disable-warning=TimeoutNegativeWarning --import tsx --test --test-reporter=spec "$@"
}
run_tests 'test/unit/**/*.test.ts'

status=0
# the model-based test of the claim/mark SQL: Postgres only, generated scenarios (~2 min)
echo '# model-based test of the claim and mark SQL on Postgres'
run_tests 'test/model/**/*.test.ts' || status=$?

client_independent='/(claim-plan|search-path|transactions|services\.smoke|services\.status|kafka-proxy|package|partitions|lambda-runtime|pooler)\.test\.ts$'
echo "# integration tests, OUTBOX_KAFKA_CLIENT=kafkajs (every file)"
TEST_KAFKA_CLIENT=kafkajs run_tests --test-concurrency=1 --test-timeout=600000 'test/integration/**/*.test.ts' || status=$?
# the second client runs even when the first failed: a failure is then known to be one client's or both's
mapfile -t relay_files < <(ls test/integration/*.test.ts | grep -Ev "$client_independent")
echo "# integration tests, OUTBOX_KAFKA_CLIENT=platformatic (${#relay_files[@]} files whose relay publishes)"
TEST_KAFKA_CLIENT=platformatic run_tests --test-concurrency=1 --test-timeout=600000 "${relay_files[@]}" || status=$?

# The guarantee tests again, with every relay connecting through PgBouncer in transaction mode
# (127.0.0.1:6432, DATABASE_PREPARE=false), as most Lambda deployments connect through a pooler or
# RDS Proxy; the tests' own statements stay direct (test/integration/helpers.ts).
echo '# the guarantee tests again, through PgBouncer (transaction mode), OUTBOX_KAFKA_CLIENT=kafkajs'
TEST_VIA_POOLER=1 TEST_KAFKA_CLIENT=kafkajs run_tests --test-concurrency=1 --test-timeout=600000 \
  test/integration/relay.test.ts test/integration/poison-rows.test.ts test/integration/missing-topics.test.ts \
  test/integration/operator-commands.test.ts test/integration/database-faults.test.ts \
  test/integration/secrets.test.ts test/integration/broker-faults.test.ts test/integration/publishing.test.ts || status=$?
exit "$status"
