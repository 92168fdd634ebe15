#!/usr/bin/env bash
# npm run bench [-- --events N --batch B --payload BYTES --aggregates A]
# npm run bench:latency [-- --rates 200,2000 --seconds 40 --period 10 --timeout 12 --wake notify|poll]
set -euo pipefail
cd "$(dirname "$0")/.."
npm run --silent services:up
script=bench/bench.ts
if [ "${1:-}" = latency ]; then script=bench/latency.ts; shift; fi
KAFKAJS_NO_PARTITIONER_WARNING=1 exec node --disable-warning=TimeoutNegativeWarning --import tsx "$script" "$@"
