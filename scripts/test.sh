#!/usr/bin/env bash
# Every test, services included: starts (or reuses) the local services, then runs every test file
# (unit, the model-based test, and the integration files once per Kafka client and their guarantee
# files again through PgBouncer) with node's built-in runner, several files at once; the files that
# stop, pause or kill a shared service run while no other file uses it (scripts/run-tests.ts says
# how, and which files run in which pass).
#
#   npm test                       everything
#   npm test -- linger relay       only the files whose job name contains "linger" or "relay"
#   TEST_CONCURRENCY=1 npm test    one file at a time
set -euo pipefail
cd "$(dirname "$0")/.."

npm run --silent services:up
exec node --import tsx scripts/run-tests.ts "$@"
