#!/usr/bin/env bash
# npm run bench [-- --events N --batch B --payload BYTES --aggregates A --peer debezium | --smoke]
# npm run bench:latency [-- --rates 200,2000 --seconds 40 --period 10 --timeout 12 --wake notify|poll --peer debezium | --smoke]
# --smoke: seconds of each measurement, failing when a figure is missing or counts fewer events
# than were sent (.ci/run runs both); not a measurement.
set -euo pipefail
cd "$(dirname "$0")/.."
npm run --silent services:up
script=bench/bench.ts
if [ "${1:-}" = latency ]; then script=bench/latency.ts; shift; fi
# Debezium's jars (Kafka Connect + the Postgres connector, ~40 MB) only when the bench runs that
# peer: tests and CI never download them.
prev=""
for arg in "$@"; do
  if [ "$arg" = --peer=debezium ] || { [ "$prev" = --peer ] && [ "$arg" = debezium ]; }; then
    bash scripts/debezium/install.sh
  fi
  prev="$arg"
done
KAFKAJS_NO_PARTITIONER_WARNING=1 exec node --import tsx "$script" "$@"
