# shellcheck shell=bash
# AWS API emulator on 127.0.0.1:4566: moto's standalone server (moto[server] from PyPI, the library
# LocalStack's own Secrets Manager grew from) in a venv under .cache/moto-venv. State is in memory:
# every start seeds the local secrets again (scripts/services/moto-seed.py), as localstack/init does.
#
#   AWS_ENDPOINT_URL=http://127.0.0.1:4566 AWS_REGION=us-east-1
#   AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test

MOTO_SPEC="moto[server]==5.2.5"
MOTO_PORT=4566
MOTO_VENV="$CACHE/moto-venv"
MOTO_DIR="$CACHE/moto"
MOTO_LOG="$MOTO_DIR/moto.log"
MOTO_PATTERN="moto_server -H 127.0.0.1 -p $MOTO_PORT"

moto_install() {
  if [[ -x "$MOTO_VENV/bin/moto_server" && "$(cat "$MOTO_VENV/.outbox-stamp" 2>/dev/null)" == "$MOTO_SPEC" ]]; then
    return 0
  fi
  mkdir -p "$MOTO_DIR"
  local py
  py="$(command -v python3 || true)"
  [[ -n "$py" ]] || { apt_install python3 python3-venv || true; py="$(command -v python3 || true)"; }
  [[ -n "$py" ]] || fail moto "python3 is required for the AWS emulator and was not found" ""
  if ! "$py" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    apt_install python3-venv || true
  fi
  log "moto: creating $MOTO_VENV with $MOTO_SPEC"
  rm -rf "$MOTO_VENV"
  "$py" -m venv "$MOTO_VENV" >"$MOTO_DIR/install.log" 2>&1 ||
    fail moto "python3 -m venv failed (on Debian: apt-get install python3-venv)" "$MOTO_DIR/install.log"
  if ! PIP_CACHE_DIR="$CACHE/pip" PIP_DISABLE_PIP_VERSION_CHECK=1 \
    "$MOTO_VENV/bin/pip" install -q "$MOTO_SPEC" >>"$MOTO_DIR/install.log" 2>&1; then
    fail moto "pip install $MOTO_SPEC failed" "$MOTO_DIR/install.log"
  fi
  printf '%s' "$MOTO_SPEC" >"$MOTO_VENV/.outbox-stamp"
}

moto_ready() {
  curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:$MOTO_PORT/moto-api/" 2>/dev/null
}

moto_up() {
  if alive moto "$MOTO_PATTERN"; then
    if paused moto; then
      log "moto: pid $(pid_of moto) was stopped (SIGSTOP); sending SIGCONT"
      kill -CONT "$(pid_of moto)"
    fi
    if moto_ready; then
      log "moto: already up (pid $(pid_of moto), http://127.0.0.1:$MOTO_PORT)"
      return 0
    fi
    fail moto "pid $(pid_of moto) runs but http://127.0.0.1:$MOTO_PORT/moto-api/ does not answer" "$MOTO_LOG"
  fi
  rm -f "$RUN/moto.pid"
  command -v curl >/dev/null 2>&1 || apt_install curl || fail moto "curl is needed for the health check" ""
  moto_install
  require_port_free moto "$MOTO_PORT" "$MOTO_LOG"
  log "moto: starting (log $MOTO_LOG)"
  spawn moto "$MOTO_LOG" env PYTHONUNBUFFERED=1 AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test \
    "$MOTO_VENV/bin/python" "$MOTO_VENV/bin/moto_server" -H 127.0.0.1 -p "$MOTO_PORT"
  local deadline=$((SECONDS + 60))
  while ((SECONDS < deadline)); do
    exited moto && fail moto "moto_server exited during start-up" "$MOTO_LOG"
    moto_ready && break
    sleep 0.3
  done
  moto_ready || fail moto "http://127.0.0.1:$MOTO_PORT/moto-api/ did not answer within 60s" "$MOTO_LOG"
  if ! AWS_ENDPOINT_URL="http://127.0.0.1:$MOTO_PORT" AWS_REGION=us-east-1 "$MOTO_VENV/bin/python" "$SERVICES_DIR/moto-seed.py" >>"$MOTO_LOG" 2>&1; then
    fail moto "seeding the local secrets (scripts/services/moto-seed.py) failed" "$MOTO_LOG"
  fi
  log "moto: up (pid $(pid_of moto)) AWS_ENDPOINT_URL=http://127.0.0.1:$MOTO_PORT"
}

moto_down() {
  if ! alive moto "$MOTO_PATTERN"; then
    rm -f "$RUN/moto.pid"
    log "moto: not running (nothing started by services.sh)"
    return 0
  fi
  log "moto: stopping pid $(pid_of moto)"
  stop_pid moto "$MOTO_PATTERN" 10
  log "moto: down"
}

moto_status() {
  if alive moto "$MOTO_PATTERN"; then
    if paused moto; then
      printf '%-9s up (paused: pid %s is SIGSTOPped)  http://127.0.0.1:%s\n' moto "$(pid_of moto)" "$MOTO_PORT"
      return 0
    fi
    if moto_ready; then
      printf '%-9s up    pid %-8s http://127.0.0.1:%s\n' moto "$(pid_of moto)" "$MOTO_PORT"
      return 0
    fi
    printf '%-9s down  (pid %s runs but http://127.0.0.1:%s does not answer; log %s)\n' moto "$(pid_of moto)" "$MOTO_PORT" "$MOTO_LOG"
    return 1
  fi
  printf '%-9s down  (log %s)\n' moto "$MOTO_LOG"
  return 1
}
