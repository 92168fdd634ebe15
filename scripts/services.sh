#!/usr/bin/env bash
# Local services for tests and the demo, no Docker needed (see localstack/README.md for Docker):
#
#   bash scripts/services.sh up      [postgres|pgbouncer|kafka|moto ...]   install (cached) + start + wait healthy
#   bash scripts/services.sh down    [postgres|pgbouncer|kafka|moto ...]   stop what `up` started (pids in .cache/run/)
#   bash scripts/services.sh status  [postgres|pgbouncer|kafka|moto ...]   up/down per service; exit 1 if any is down
#   bash scripts/services.sh restart [postgres|pgbouncer|kafka|moto ...]   down + up
#
#   Postgres 15  127.0.0.1:5432  postgres://outbox:outbox@127.0.0.1:5432/outbox  (superuser postgres/postgres), TLS too
#   PgBouncer    127.0.0.1:6432  the same database through a transaction-mode pooler (scripts/services/pgbouncer.sh)
#   Kafka 4      127.0.0.1:9092  KRaft single node, auto-create off              (pid: .cache/run/kafka.pid)
#                127.0.0.1:9094  SASL/SCRAM-SHA-256/512, user relay / relay-secret
#                127.0.0.1:9095, :9097 (SASL) advertised as :9096, :9098, for test proxies (scripts/services/kafka.sh)
#                127.0.0.1:9099  SSL; 127.0.0.1:9100 SASL_SSL (SCRAM)
#   TLS          .cache/tls/ca.pem signs every certificate: NODE_EXTRA_CA_CERTS=.cache/tls/ca.pem (scripts/services/tls.sh)
#   moto         127.0.0.1:4566  AWS_ENDPOINT_URL=http://127.0.0.1:4566, keys test/test, us-east-1
#   kcat         .cache/kcat/kcat, installed with Kafka: Debian's package, unpacked (scripts/services/kcat.sh)
#
# `up` is idempotent: running services are checked, not restarted, and a dead one (e.g. a broker
# killed by a test) is started again. Everything lives under .cache/ (downloads, data, logs, pids).
# OUTBOX_SERVICES=docker runs localstack/docker-compose.yml instead.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=services/lib.sh
source "$ROOT/scripts/services/lib.sh"

ALL=(postgres pgbouncer kafka moto)

usage() {
  sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

cmd="${1:-}"
[[ -n "$cmd" ]] || usage
shift

if [[ "${OUTBOX_SERVICES:-local}" == docker ]]; then
  # shellcheck source=services/docker.sh
  source "$SERVICES_DIR/docker.sh"
  case "$cmd" in
    up) docker_up ;;
    down) docker_down ;;
    status) docker_status ;;
    restart) docker_down && docker_up ;;
    *) usage ;;
  esac
  exit
fi
[[ "${OUTBOX_SERVICES:-local}" == local ]] || fail services "OUTBOX_SERVICES must be 'local' (default) or 'docker'" ""

# shellcheck source=services/tls.sh
source "$SERVICES_DIR/tls.sh"
# shellcheck source=services/postgres.sh
source "$SERVICES_DIR/postgres.sh"
# shellcheck source=services/pgbouncer.sh
source "$SERVICES_DIR/pgbouncer.sh"
# shellcheck source=services/kafka.sh
source "$SERVICES_DIR/kafka.sh"
# shellcheck source=services/moto.sh
source "$SERVICES_DIR/moto.sh"
# shellcheck source=services/kcat.sh
source "$SERVICES_DIR/kcat.sh"

# One services.sh at a time changes things (two `up`s racing would start two brokers).
if [[ "$cmd" != status ]]; then
  exec 9>"$RUN/.lock"
  flock -w 600 9 || fail services "another services.sh has held $RUN/.lock for 10 minutes" ""
fi

services=("$@")
if [[ ${#services[@]} -eq 0 ]]; then services=("${ALL[@]}"); fi
for s in "${services[@]}"; do
  case "$s" in
    postgres | pgbouncer | kafka | moto) ;;
    aws) ;;
    *) fail services "unknown service '$s' (expected: ${ALL[*]})" "" ;;
  esac
done
fn_prefix() {
  case "$1" in
    postgres) printf pg ;;
    pgbouncer) printf pgb ;;
    aws) printf moto ;;
    *) printf '%s' "$1" ;;
  esac
}

case "$cmd" in
  up)
    start=$SECONDS
    # On a fresh machine, fetch Kafka's jars (Maven) and moto's venv (pip) side by side; each
    # is a no-op once cached. A failure inside prints its own message and log tail.
    installs=()
    for s in "${services[@]}"; do
      case "$(fn_prefix "$s")" in
        kafka)
          alive kafka "$KAFKA_PATTERN" || { kafka_install & installs+=($!); }
          # the tests' third-party reader (test/integration/kcat.test.ts); a stamp check once cached
          kcat_install &
          installs+=($!)
          ;;
        moto) alive moto "$MOTO_PATTERN" || { moto_install & installs+=($!); } ;;
      esac
    done
    failed=0
    for p in "${installs[@]}"; do wait "$p" || failed=1; done
    ((failed == 0)) || exit 1
    tls_certs
    for s in "${services[@]}"; do "$(fn_prefix "$s")_up"; done
    log "all up in $((SECONDS - start))s: ${services[*]}"
    ;;
  down)
    # reverse order: the AWS emulator and the broker first, the database last
    for ((i = ${#services[@]} - 1; i >= 0; i--)); do "$(fn_prefix "${services[i]}")_down"; done
    ;;
  restart)
    for ((i = ${#services[@]} - 1; i >= 0; i--)); do "$(fn_prefix "${services[i]}")_down"; done
    tls_certs
    for s in "${services[@]}"; do "$(fn_prefix "$s")_up"; done
    ;;
  status)
    rc=0
    for s in "${services[@]}"; do "$(fn_prefix "$s")_status" || rc=1; done
    exit "$rc"
    ;;
  *) usage ;;
esac
