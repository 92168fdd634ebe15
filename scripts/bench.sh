#!/usr/bin/env bash
# npm run bench [-- --events N --batch B --payload BYTES --aggregates A]
set -euo pipefail
cd "$(dirname "$0")/.."
npm run --silent services:up
KAFKAJS_NO_PARTITIONER_WARNING=1 exec node --disable-warning=TimeoutNegativeWarning --import tsx bench/bench.ts "$@"
