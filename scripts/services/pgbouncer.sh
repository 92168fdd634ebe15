# shellcheck shell=bash
# PgBouncer in transaction mode on 127.0.0.1:6432, in front of the local Postgres (postgres.sh):
# the connection pooler most Lambda-to-Postgres deployments go through (or RDS Proxy, which pools
# the same way). Tests point the relay at it to prove the relay works through a transaction pooler
# (docs/development.md, "Local services"; test/integration/pooler.test.ts and the pooled run in
# scripts/test.sh).
#
#   URL   postgres://outbox:outbox@127.0.0.1:6432/outbox   (with DATABASE_PREPARE=false)
#         postgres://postgres:postgres@127.0.0.1:6432/outbox also works (superuser, same passwords as postgres.sh)
#
# Debian's own package (bookworm: 1.18, which has no protocol-level prepared statements; that is the
# point: 1.18 is what a deployment typically has, and RDS Proxy behaves alike). Its .deb is kept in
# .cache/pgbouncer/debs. PgBouncer refuses to run as root, so as root it runs as the same
# unprivileged user as Postgres (setpriv execs in place, so the recorded pid is PgBouncer's own).
# The configuration is generated under .cache/pgbouncer on every start; the log goes to
# .cache/pgbouncer/pgbouncer.log (PgBouncer writes it to stderr, services.sh redirects it).

PGB_PORT=6432
PGB_BIN="${PGB_BIN:-/usr/sbin/pgbouncer}"
PGB_LOG="$CACHE/pgbouncer/pgbouncer.log"
PGB_PATTERN="pgbouncer.ini"
# pgbouncer's users and passwords are those postgres.sh creates; rotations by tests (ALTER ROLE)
# happen on direct connections only
PGB_USERS=("outbox:outbox" "postgres:$PG_SUPERPASS")

pgb_install() {
  [[ -x "$PGB_BIN" ]] && return 0
  local debs="$CACHE/pgbouncer/debs" policy=/usr/sbin/policy-rc.d created_policy=""
  mkdir -p "$debs/partial"
  # The package's postinst would start Debian's own pgbouncer service on 6432 (the port ours
  # needs). policy-rc.d exit 101 is Debian's documented "do not start services" switch; put one
  # in place for the install only, if the machine has none.
  if is_root && [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && created_policy=1
  fi
  local ok=0
  APT_ARCHIVES="$debs" apt_install pgbouncer || ok=1
  [[ -n "$created_policy" ]] && rm -f "$policy"
  if ((ok != 0)) || [[ ! -x "$PGB_BIN" ]]; then
    fail pgbouncer "pgbouncer not found at $PGB_BIN and could not be installed (apt-get install pgbouncer needs root); install it or set PGB_BIN" ""
  fi
}

# Where PgBouncer's files live: .cache/pgbouncer, or, if the unprivileged user cannot enter it (a
# clone under /root), a directory under /var/tmp symlinked from there, as postgres.sh does.
pgb_dir() {
  if [[ -L "$CACHE/pgbouncer" ]]; then readlink -f "$CACHE/pgbouncer"; else printf '%s' "$CACHE/pgbouncer"; fi
}

pgb_prepare_dir() {
  mkdir -p "$(pgb_dir)"
  is_root || return 0
  local user ext
  user="$(pg_os_user)"
  chown "$user:" "$(pgb_dir)"
  if ! runuser -u "$user" -- test -r "$(pgb_dir)" 2>/dev/null; then
    ext="/var/tmp/outbox-relay-pgbouncer-$(printf '%s' "$ROOT" | sha256sum | cut -c1-12)"
    log "pgbouncer: user $user cannot enter $CACHE/pgbouncer; its files live in $ext, symlinked from .cache/pgbouncer"
    mkdir -p "$ext"
    chown "$user:" "$ext"
    chmod 700 "$ext"
    if [[ -d "$CACHE/pgbouncer/debs" ]]; then mv "$CACHE/pgbouncer/debs" "$ext/" 2>/dev/null || true; fi
    rm -rf "$CACHE/pgbouncer"
    ln -s "$ext" "$CACHE/pgbouncer"
  fi
}

pgb_write_conf() {
  local dir users u
  dir="$(pgb_dir)"
  users="$dir/userlist.txt"
  : >"$users"
  chmod 600 "$users"
  # plain passwords: PgBouncer then logs in to Postgres with SCRAM itself (postgres.sh sets
  # scram-sha-256 everywhere) and checks clients with SCRAM too
  for u in "${PGB_USERS[@]}"; do printf '"%s" "%s"\n' "${u%%:*}" "${u#*:}" >>"$users"; done
  cat >"$dir/pgbouncer.ini" <<EOF
; Written by scripts/services/pgbouncer.sh on every start.
[databases]
; every database of the local Postgres, by the name the client asks for
* = host=127.0.0.1 port=$PG_PORT

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PGB_PORT
; TCP only, as postgres.sh: the repo path can exceed the unix socket path limit
unix_socket_dir =
auth_type = scram-sha-256
auth_file = $users
; what RDS Proxy and most Lambda deployments use: a server connection per transaction
pool_mode = transaction
; G3 runs 6 warm relays at once, each up to 3 transactions open (claim ahead, batch, retention)
max_client_conn = 1000
default_pool_size = 40
max_db_connections = 80
; postgres.js sends none of these, but other clients (psql, JDBC) do
ignore_startup_parameters = extra_float_digits,options
; log to stderr (services.sh keeps it in the log file)
logfile =
pidfile =
log_connections = 0
log_disconnections = 0
admin_users = postgres
stats_users = postgres
EOF
  if is_root; then chown "$(pg_os_user):" "$users" "$dir/pgbouncer.ini"; fi
}

pgb_ready() {
  # a real login through the pooler, not only an open port: proves auth and the server side
  PGPASSWORD=outbox PGCONNECT_TIMEOUT=3 "$PG_BIN/psql" -X -q -At -h 127.0.0.1 -p "$PGB_PORT" -U outbox -d outbox \
    -c 'SELECT 1' >/dev/null 2>&1
}

# pgb_foreign: a PgBouncer this checkout did not start (another clone's services.sh, sharing the
# machine's ports) serves 6432 in transaction mode; it is as good as ours, and is used, not fought.
pgb_foreign() {
  alive pgbouncer "$PGB_PATTERN" && return 1
  port_open "$PGB_PORT" || return 1
  local mode
  mode="$(PGPASSWORD="$PG_SUPERPASS" PGCONNECT_TIMEOUT=3 "$PG_BIN/psql" -X -q -At -h 127.0.0.1 -p "$PGB_PORT" -U postgres -d pgbouncer \
    -c 'SHOW CONFIG' 2>/dev/null | awk -F'|' '$1 == "pool_mode" {print $2}')"
  [[ "$mode" == transaction ]] && pgb_ready
}

pgb_up() {
  if pgb_foreign; then
    log "pgbouncer: 127.0.0.1:$PGB_PORT is already served by a transaction-mode PgBouncer this checkout did not start $(port_owner "$PGB_PORT"); using it"
    return 0
  fi
  if alive pgbouncer "$PGB_PATTERN"; then
    if paused pgbouncer; then
      log "pgbouncer: pid $(pid_of pgbouncer) was stopped (SIGSTOP); sending SIGCONT"
      kill -CONT "$(pid_of pgbouncer)"
    fi
    if pgb_ready; then
      log "pgbouncer: already up (pid $(pid_of pgbouncer), 127.0.0.1:$PGB_PORT)"
      return 0
    fi
    fail pgbouncer "pid $(pid_of pgbouncer) runs but a login through 127.0.0.1:$PGB_PORT fails (is Postgres up?)" "$PGB_LOG"
  fi
  rm -f "$RUN/pgbouncer.pid"
  pg_ready 2 || fail pgbouncer "Postgres on 127.0.0.1:$PG_PORT is not up: start it first (services.sh up postgres pgbouncer)" ""
  pgb_install
  pgb_prepare_dir
  pgb_write_conf
  PGB_LOG="$(pgb_dir)/pgbouncer.log"
  require_port_free pgbouncer "$PGB_PORT" "$PGB_LOG"
  log "pgbouncer: starting (transaction mode, log $PGB_LOG)"
  if is_root; then
    local user
    user="$(pg_os_user)"
    spawn pgbouncer "$PGB_LOG" setpriv --reuid="$user" --regid="$(id -g "$user")" --init-groups "$PGB_BIN" "$(pgb_dir)/pgbouncer.ini"
  else
    spawn pgbouncer "$PGB_LOG" "$PGB_BIN" "$(pgb_dir)/pgbouncer.ini"
  fi
  local deadline=$((SECONDS + 30))
  while ((SECONDS < deadline)); do
    exited pgbouncer && fail pgbouncer "pgbouncer exited during start-up" "$PGB_LOG"
    pgb_ready && break
    sleep 0.2
  done
  pgb_ready || fail pgbouncer "no login through 127.0.0.1:$PGB_PORT within 30s" "$PGB_LOG"
  log "pgbouncer: up (pid $(pid_of pgbouncer)) postgres://outbox:outbox@127.0.0.1:$PGB_PORT/outbox (transaction mode; DATABASE_PREPARE=false)"
}

pgb_down() {
  if ! alive pgbouncer "$PGB_PATTERN"; then
    rm -f "$RUN/pgbouncer.pid"
    log "pgbouncer: not running (nothing started by services.sh)"
    return 0
  fi
  log "pgbouncer: stopping pid $(pid_of pgbouncer)"
  # SIGINT: PgBouncer's "safe shutdown" waits for clients; SIGTERM closes at once, what a test box wants
  stop_pid pgbouncer "$PGB_PATTERN" 10
  log "pgbouncer: down"
}

pgb_status() {
  if pgb_foreign; then
    printf '%-9s up    (not started by this checkout %s) postgres://outbox:outbox@127.0.0.1:%s/outbox (transaction mode)\n' pgbouncer "$(port_owner "$PGB_PORT")" "$PGB_PORT"
    return 0
  fi
  if alive pgbouncer "$PGB_PATTERN"; then
    if paused pgbouncer; then
      printf '%-9s up (paused: pid %s is SIGSTOPped)  127.0.0.1:%s\n' pgbouncer "$(pid_of pgbouncer)" "$PGB_PORT"
      return 0
    fi
    if pgb_ready; then
      printf '%-9s up    pid %-8s postgres://outbox:outbox@127.0.0.1:%s/outbox (transaction mode)\n' pgbouncer "$(pid_of pgbouncer)" "$PGB_PORT"
      return 0
    fi
    printf '%-9s down  (pid %s runs but no login through 127.0.0.1:%s; log %s)\n' pgbouncer "$(pid_of pgbouncer)" "$PGB_PORT" "$PGB_LOG"
    return 1
  fi
  printf '%-9s down  (log %s)\n' pgbouncer "$PGB_LOG"
  return 1
}
