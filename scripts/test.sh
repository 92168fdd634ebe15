#!/usr/bin/env bash
# Every test, services included: starts (or reuses) the local services, then runs unit and
# integration tests with node's built-in runner. Integration files run one at a time because
# some of them stop, pause or kill the shared broker and database connections on purpose. The
# guarantee tests then run a second time through the transaction pooler.
set -euo pipefail
cd "$(dirname "$0")/.."

npm run --silent services:up

export KAFKAJS_NO_PARTITIONER_WARNING=1
node --disable-warning=TimeoutNegativeWarning --import tsx --test --test-reporter=spec 'test/unit/**/*.test.ts'
node --disable-warning=TimeoutNegativeWarning --import tsx --test --test-reporter=spec --test-concurrency=1 --test-timeout=600000 'test/integration/**/*.test.ts'

# The guarantee tests (G1-G7) again, with every relay connecting through PgBouncer in transaction
# mode (127.0.0.1:6432, DATABASE_PREPARE=false), as most Lambda deployments connect through a
# pooler or RDS Proxy; the tests' own statements stay direct (test/integration/helpers.ts).
echo '--- the guarantee tests again, through PgBouncer (transaction mode) ---'
TEST_VIA_POOLER=1 node --disable-warning=TimeoutNegativeWarning --import tsx --test --test-reporter=spec --test-concurrency=1 --test-timeout=600000 \
  test/integration/relay.test.ts test/integration/failures.test.ts test/integration/publishing.test.ts
