#!/usr/bin/env bash
# npm run demo: services up, migrate, write events, relay them on a local schedule, show them on Kafka.
set -euo pipefail
cd "$(dirname "$0")/.."
npm run --silent services:up
KAFKAJS_NO_PARTITIONER_WARNING=1 exec node --import tsx scripts/demo.ts
