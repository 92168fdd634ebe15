# shellcheck shell=bash
# Postgres 15 on 127.0.0.1:5432: our own cluster (initdb into .cache/postgres/data), not the
# Debian one, so `down` stops exactly what `up` started. Postgres refuses to run as root, so as
# root it runs as the unprivileged `postgres` user (created by the Debian package) via runuser.
#
#   superuser  postgres / postgres   (pg_terminate_backend, ALTER ROLE ... PASSWORD in tests)
#   app role   outbox / outbox       LOGIN CREATEROLE REPLICATION, owner of database outbox
#   URL        postgres://outbox:outbox@127.0.0.1:5432/outbox
#
# Only TCP on 127.0.0.1 (no unix socket: the repo path can exceed the 107-byte socket limit),
# scram-sha-256 everywhere, wal_level=logical (Debezium-compatible table, logical slots work).
# TLS on (ssl = on, the certificate of scripts/services/tls.sh for localhost and 127.0.0.1);
# plaintext is still accepted. A running server takes new certificates with a reload, no restart.

PG_MAJOR=15
PG_PORT=5432
PG_BIN="${PG_BIN:-/usr/lib/postgresql/$PG_MAJOR/bin}"
PG_DIR="$CACHE/postgres"   # resolved by pg_prepare_dirs (see pg_home)
PG_LOG="$PG_DIR/postgres.log"
PG_PATTERN="bin/postgres"
PG_SUPERPASS="postgres"

pg_os_user() {
  if is_root; then printf '%s' "${OUTBOX_PG_OS_USER:-postgres}"; else id -un; fi
}

# as_pg CMD...: run as the unprivileged cluster owner (from /, which it can always enter), without
# services.sh's lock fd (the postmaster that pg_ctl leaves running must not hold it).
as_pg() {
  if is_root; then
    (cd / && runuser -u "$(pg_os_user)" -- "$@" 9>&-)
  else
    (cd / && "$@" 9>&-)
  fi
}

pg_install() {
  if [[ ! -x "$PG_BIN/initdb" || ! -x "$PG_BIN/pg_ctl" || ! -x "$PG_BIN/psql" ]]; then
    # Installing postgresql-15 would also create *and start* a Debian cluster on 5432; tell
    # postgresql-common not to create one, since our own cluster needs that port.
    if is_root; then
      mkdir -p /etc/postgresql-common
      grep -qs '^create_main_cluster' /etc/postgresql-common/createcluster.conf ||
        printf 'create_main_cluster = false\n' >>/etc/postgresql-common/createcluster.conf
    fi
    apt_install "postgresql-$PG_MAJOR" "postgresql-client-$PG_MAJOR" ||
      fail postgres "PostgreSQL $PG_MAJOR not found in $PG_BIN and could not be installed (apt-get install postgresql-$PG_MAJOR needs root); install it or set PG_BIN" ""
  fi
  if is_root && ! id -u "$(pg_os_user)" >/dev/null 2>&1; then
    useradd --system --user-group --home-dir /var/lib/postgresql --shell /usr/sbin/nologin "$(pg_os_user)" ||
      fail postgres "could not create the unprivileged user $(pg_os_user) to run Postgres as" ""
  fi
}

# Where the cluster lives: normally .cache/postgres. When the repo sits where the unprivileged user
# cannot enter (e.g. a clone under /root, mode 700), .cache/postgres becomes a symlink to
# /var/tmp/outbox-relay-pg-<hash of the repo path>, and Postgres is only ever given resolved paths.
pg_home() {
  if [[ -L "$CACHE/postgres" ]]; then readlink -f "$CACHE/postgres"; else printf '%s' "$CACHE/postgres"; fi
}
pg_data() { printf '%s/data' "$(pg_home)"; }

pg_prepare_dirs() {
  local user ext
  if [[ -L "$CACHE/postgres" ]]; then
    mkdir -p "$(pg_home)"
  else
    mkdir -p "$CACHE/postgres"
  fi
  is_root || { PG_DIR="$(pg_home)"; PG_LOG="$PG_DIR/postgres.log"; return 0; }
  user="$(pg_os_user)"
  chown "$user:" "$(pg_home)"
  if ! runuser -u "$user" -- test -w "$(pg_home)" 2>/dev/null; then
    ext="/var/tmp/outbox-relay-pg-$(printf '%s' "$ROOT" | sha256sum | cut -c1-12)"
    log "postgres: user $user cannot enter $CACHE/postgres (a parent directory is private); the cluster lives in $ext, symlinked from .cache/postgres"
    mkdir -p "$ext"
    chmod 700 "$ext"
    chown "$user:" "$ext"
    runuser -u "$user" -- test -w "$ext" || fail postgres "user $user cannot write $ext either" ""
    rm -rf "$CACHE/postgres"
    ln -s "$ext" "$CACHE/postgres"
  fi
  PG_DIR="$(pg_home)"
  PG_LOG="$PG_DIR/postgres.log"
  [[ -d "$PG_DIR/data" ]] && chown -R "$user:" "$PG_DIR/data"
  return 0
}

pg_initdb() {
  local data pwfile
  data="$(pg_data)"
  [[ -f "$data/PG_VERSION" ]] && return 0
  log "postgres: initdb $data"
  mkdir -p "$data"
  is_root && chown "$(pg_os_user):" "$data"
  chmod 700 "$data"
  pwfile="$(dirname "$data")/.pgpass-init"
  printf '%s\n' "$PG_SUPERPASS" >"$pwfile"
  is_root && chown "$(pg_os_user):" "$pwfile"
  chmod 600 "$pwfile"
  if ! as_pg "$PG_BIN/initdb" -D "$data" -U postgres --pwfile="$pwfile" -E UTF8 --locale=C \
    --auth-host=scram-sha-256 --auth-local=scram-sha-256 >"$PG_DIR/initdb.log" 2>&1; then
    rm -f "$pwfile"
    fail postgres "initdb failed" "$PG_DIR/initdb.log"
  fi
  rm -f "$pwfile"
}

pg_write_conf() {
  local data conf
  data="$(pg_data)"
  conf="$data/outbox-local.conf"
  cat >"$conf" <<EOF
# Written by scripts/services/postgres.sh on every start: local test box settings.
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = ''
max_connections = 200
wal_level = logical
max_wal_senders = 10
max_replication_slots = 10
# sized like a small production server rather than initdb's defaults (128MB, 1GB): with those,
# backends evict dirty buffers themselves and a checkpoint is forced every ~1 GB of WAL, which
# the relay's write pattern (every row inserted, then updated once) hits within a minute
shared_buffers = 1GB
max_wal_size = 4GB
# No fsync: a COMMIT answers once its WAL is written to the kernel, not once the disk has it. The
# test box shares one disk with Kafka and several test files, and there a WAL flush has stalled 6 s
# (a CI run's postgres.log: four COMMITs answered together after 4-6 s), failing an invocation on
# its deadline for want of a disk, not of anything the relay does. A process crash (kill -9,
# an immediate shutdown, the failover test's primary) loses nothing this way: the kernel has the
# WAL. Only a crash of the machine itself would, which no test makes. Slow databases are tested
# on purpose (test/integration/pg-proxy.ts, database-faults.test.ts), not left to the disk.
fsync = off
password_encryption = 'scram-sha-256'
timezone = 'UTC'
log_timezone = 'UTC'
log_line_prefix = '%m [%p] %q%u@%d '
log_min_messages = warning
log_connections = off
# a failed test's postgres.log shows what the server was waiting for: lock waits past
# deadlock_timeout (1 s), statements slower than 1 s, checkpoints
log_lock_waits = on
log_min_duration_statement = 1000
log_checkpoints = on
ssl = on
ssl_cert_file = '$(pg_home)/tls/server.pem'
ssl_key_file = '$(pg_home)/tls/server.key'
EOF
  is_root && chown "$(pg_os_user):" "$conf"
  grep -q "^include_if_exists = 'outbox-local.conf'" "$data/postgresql.conf" ||
    printf "\ninclude_if_exists = 'outbox-local.conf'\n" >>"$data/postgresql.conf"
}

# pg_tls_files: the server's certificate and key where the server's user can read them (Postgres
# refuses a key others can read). Returns 1 when they changed (a running server must reload).
pg_tls_files() {
  local dir
  dir="$(pg_home)/tls"
  mkdir -p "$dir"
  if cmp -s "$TLS_DIR/server.pem" "$dir/server.pem" && cmp -s "$TLS_DIR/server.key" "$dir/server.key"; then return 0; fi
  install -m 644 "$TLS_DIR/server.pem" "$dir/server.pem"
  install -m 600 "$TLS_DIR/server.key" "$dir/server.key"
  is_root && chown -R "$(pg_os_user):" "$dir"
  return 1
}

# pg_tls_check: a verify-full connection succeeds (the CA checks the certificate, the name matches).
pg_tls_check() {
  PGSSLMODE=verify-full PGSSLROOTCERT="$TLS_DIR/ca.pem" pg_psql -d postgres -Atc 'SELECT 1' >/dev/null 2>>"$PG_LOG"
}

# A server started before ssl = on (or with certificates since made again): its settings reloaded.
pg_tls_reload() {
  local changed=0
  pg_tls_files || changed=1
  if ((changed == 0)) && pg_tls_check; then return 0; fi
  log "postgres: turning TLS on / taking the new certificate (pg_reload_conf, no restart)"
  pg_write_conf
  pg_psql -d postgres -Atc 'SELECT pg_reload_conf()' >/dev/null 2>>"$PG_LOG" || fail postgres "pg_reload_conf() failed" "$PG_LOG"
  local i
  for ((i = 0; i < 25; i++)); do
    pg_tls_check && return 0
    sleep 0.2
  done
  fail postgres "TLS does not work after a reload: psql with sslmode=verify-full and $TLS_DIR/ca.pem was refused" "$PG_LOG"
}

pg_ready() {
  "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" -t "${1:-2}" >/dev/null 2>&1
}

pg_psql() {
  PGPASSWORD="$PG_SUPERPASS" PGCONNECT_TIMEOUT=5 "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 \
    -h 127.0.0.1 -p "$PG_PORT" -U postgres "$@"
}

# The role and database the relay and tests use; created once, never reset (a test may rotate
# the password with ALTER ROLE; `down` + `rm -rf .cache/postgres` gives a fresh cluster).
pg_bootstrap() {
  pg_psql -d postgres >>"$PG_LOG" 2>&1 <<'SQL' || fail postgres "could not create role/database outbox" "$PG_LOG"
DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'outbox') THEN
    CREATE ROLE outbox LOGIN CREATEROLE REPLICATION PASSWORD 'outbox';
  END IF;
END $$;
SELECT 'CREATE DATABASE outbox OWNER outbox' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'outbox')
\gexec
SQL
}

# outbox-local.conf asks for wal_level=logical (logical slots: the bench's Debezium peer), which
# takes effect only at a server start: a server started before that line existed still runs
# without it. Say so (a warning: the tests do not need it); never restart it behind anyone's back.
pg_check_logical() {
  local level
  level="$(pg_psql -d postgres -Atc 'SHOW wal_level' 2>/dev/null)" || return 0
  [[ "$level" == logical ]] ||
    log "postgres: WARNING: the running server has wal_level=$level, not logical (it was started before that setting); logical replication (npm run bench -- --peer debezium) needs one restart: npm run services:down && npm run services:up"
}

pg_up() {
  if alive postgres "$PG_PATTERN"; then
    if paused postgres; then
      log "postgres: pid $(pid_of postgres) was stopped (SIGSTOP); sending SIGCONT"
      kill -CONT "$(pid_of postgres)"
    fi
    if pg_ready 5; then
      pg_tls_reload
      log "postgres: already up (pid $(pid_of postgres), 127.0.0.1:$PG_PORT, TLS on)"
      pg_check_logical
      return 0
    fi
    fail postgres "pid $(pid_of postgres) runs but does not accept connections on 127.0.0.1:$PG_PORT" "$PG_LOG"
  fi
  rm -f "$RUN/postgres.pid"
  pg_install
  pg_prepare_dirs
  pg_initdb
  pg_tls_files || true
  pg_write_conf
  require_port_free postgres "$PG_PORT" "$PG_LOG"
  local data
  data="$(pg_data)"
  log "postgres: starting (data $data, log $PG_LOG)"
  [[ -s "$PG_LOG" ]] && mv -f "$PG_LOG" "$PG_LOG.1"
  : >"$PG_LOG"
  is_root && chown "$(pg_os_user):" "$PG_LOG" "$PG_DIR"
  # pg_ctl detaches the postmaster itself (setsid) and -w waits until it accepts connections
  if ! as_pg "$PG_BIN/pg_ctl" -D "$data" -l "$PG_LOG" -w -t 60 start >>"$PG_LOG.ctl" 2>&1; then
    cat "$PG_LOG.ctl" >>"$PG_LOG" 2>/dev/null || true
    fail postgres "pg_ctl start failed or did not become ready within 60s" "$PG_LOG"
  fi
  head -n1 "$data/postmaster.pid" >"$RUN/postgres.pid"
  local i
  for ((i = 0; i < 100; i++)); do
    pg_ready 1 && break
    exited postgres && fail postgres "the postmaster exited during start-up" "$PG_LOG"
    sleep 0.2
  done
  pg_ready 2 || fail postgres "not accepting connections on 127.0.0.1:$PG_PORT after 20s" "$PG_LOG"
  pg_bootstrap
  pg_tls_check || fail postgres "started, but refuses TLS with sslmode=verify-full and $TLS_DIR/ca.pem" "$PG_LOG"
  log "postgres: up (pid $(pid_of postgres)) postgres://outbox:outbox@127.0.0.1:$PG_PORT/outbox (TLS on)"
}

pg_down() {
  if ! alive postgres "$PG_PATTERN"; then
    rm -f "$RUN/postgres.pid"
    log "postgres: not running (nothing started by services.sh)"
    return 0
  fi
  local pid
  pid="$(pid_of postgres)"
  kill -CONT "$pid" 2>/dev/null || true
  log "postgres: stopping pid $pid"
  as_pg "$PG_BIN/pg_ctl" -D "$(pg_data)" -m fast -w -t 60 stop >>"$PG_LOG.ctl" 2>&1 || true
  stop_pid postgres "$PG_PATTERN" 10
  log "postgres: down"
}

pg_status() {
  if alive postgres "$PG_PATTERN"; then
    if paused postgres; then
      printf '%-9s up (paused: pid %s is SIGSTOPped)  127.0.0.1:%s\n' postgres "$(pid_of postgres)" "$PG_PORT"
      return 0
    fi
    if pg_ready 2; then
      printf '%-9s up    pid %-8s postgres://outbox:outbox@127.0.0.1:%s/outbox\n' postgres "$(pid_of postgres)" "$PG_PORT"
      return 0
    fi
    printf '%-9s down  (pid %s runs but 127.0.0.1:%s does not accept connections; log %s)\n' postgres "$(pid_of postgres)" "$PG_PORT" "$PG_LOG"
    return 1
  fi
  printf '%-9s down  (log %s)\n' postgres "$PG_LOG"
  return 1
}
