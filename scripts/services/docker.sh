# shellcheck shell=bash
# OUTBOX_SERVICES=docker: the same three services from localstack/docker-compose.yml, on the same
# ports. The AWS emulator is LocalStack when LOCALSTACK_AUTH_TOKEN is set (its image needs one
# since March 2026), else moto's image; OUTBOX_AWS=localstack|moto forces one.

COMPOSE_FILE="$ROOT/localstack/docker-compose.yml"

docker_aws() {
  local aws="${OUTBOX_AWS:-}"
  if [[ -z "$aws" ]]; then
    if [[ -n "${LOCALSTACK_AUTH_TOKEN:-}" ]]; then aws=localstack; else aws=moto; fi
  fi
  case "$aws" in
    localstack | moto) printf '%s' "$aws" ;;
    *) fail docker "OUTBOX_AWS must be localstack or moto, not '$aws'" "" ;;
  esac
}

compose() {
  command -v docker >/dev/null 2>&1 || fail docker "OUTBOX_SERVICES=docker but the docker CLI is not installed" ""
  docker compose -f "$COMPOSE_FILE" "$@"
}

docker_up() {
  local aws
  aws="$(docker_aws)"
  log "docker: starting postgres, kafka and $aws (profile $aws) from $COMPOSE_FILE"
  # --wait returns once every named service is healthy (and fails if one is not)
  compose --profile "$aws" up -d --wait postgres kafka "$aws" ||
    fail docker "docker compose up failed; see: docker compose -f $COMPOSE_FILE logs" ""
  # one-shot init containers: demo topic, and (moto only; LocalStack runs its ready.d hook) secrets
  compose --profile "$aws" run --rm --no-deps kafka-init ||
    fail kafka "creating the demo topic failed; see: docker compose -f $COMPOSE_FILE logs kafka" ""
  if [[ "$aws" == moto ]]; then
    compose --profile moto run --rm --no-deps moto-init ||
      fail moto "seeding the secrets failed; see: docker compose -f $COMPOSE_FILE logs moto" ""
  fi
  log "docker: up"
}

docker_down() {
  compose --profile localstack --profile moto down --remove-orphans
}

docker_status() {
  local running rc=0 svc
  running="$(compose --profile localstack --profile moto ps --status running --services 2>/dev/null || true)"
  for svc in postgres kafka; do
    if grep -qx "$svc" <<<"$running"; then printf '%-10s up    (docker)\n' "$svc"; else printf '%-10s down  (docker)\n' "$svc"; rc=1; fi
  done
  if grep -qx localstack <<<"$running"; then
    printf '%-10s up    (docker)\n' localstack
  elif grep -qx moto <<<"$running"; then
    printf '%-10s up    (docker)\n' moto
  else
    printf '%-10s down  (docker: neither localstack nor moto runs)\n' aws
    rc=1
  fi
  return "$rc"
}
