#!/usr/bin/env bash
# Every test, services included: starts (or reuses) the local services, then runs unit and
# integration tests with node's built-in runner. Integration files run one at a time because
# some of them stop, pause or kill the shared broker and database connections on purpose.
set -euo pipefail
cd "$(dirname "$0")/.."

npm run --silent services:up

export KAFKAJS_NO_PARTITIONER_WARNING=1
node --disable-warning=TimeoutNegativeWarning --import tsx --test --test-reporter=spec 'test/unit/**/*.test.ts'
node --disable-warning=TimeoutNegativeWarning --import tsx --test --test-reporter=spec --test-concurrency=1 --test-timeout=600000 'test/integration/**/*.test.ts'
