# shellcheck shell=bash
# Helpers shared by scripts/services/*.sh (sourced by scripts/services.sh; not run on its own).
# Everything the local services download, store or log lives under $CACHE (.cache/, git-ignored);
# the pids of what `up` started live in $RUN and are the only processes `down` ever signals.

ROOT="${ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
# resolved: worktrees that share one .cache (a symlink) then name the same running services
CACHE="$(readlink -f "$ROOT/.cache" 2>/dev/null || printf "%s" "$ROOT/.cache")"
RUN="$CACHE/run"
SERVICES_DIR="$ROOT/scripts/services"
mkdir -p "$RUN"

log() { printf '[services] %s\n' "$*" >&2; }

# fail SERVICE WHY [LOGFILE]: a clear message naming the service, why, where its log is, and its tail.
fail() {
  local svc="$1" why="$2" logfile="${3:-}"
  {
    printf '\n[services] ERROR: %s: %s\n' "$svc" "$why"
    if [[ -n "$logfile" ]]; then
      printf '[services] %s log: %s\n' "$svc" "$logfile"
      if [[ -s "$logfile" ]]; then
        printf -- '----- last 40 lines of %s -----\n' "$logfile"
        tail -n 40 "$logfile"
        printf -- '----- end of %s -----\n' "$logfile"
      fi
    fi
  } >&2
  exit 1
}

is_root() { [[ "$(id -u)" -eq 0 ]]; }

# apt_install PKG...: used only when a tool is missing on a fresh machine (needs root).
# APT_ARCHIVES=DIR keeps the downloaded .debs there (under .cache) instead of apt's own cache.
APT_UPDATED=""
apt_install() {
  if ! is_root || ! command -v apt-get >/dev/null 2>&1; then
    return 1
  fi
  log "installing Debian packages: $*"
  if [[ -z "$APT_UPDATED" ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || return 1
    APT_UPDATED=1
  fi
  local opts=()
  if [[ -n "${APT_ARCHIVES:-}" ]]; then
    mkdir -p "$APT_ARCHIVES/partial"
    opts=(-o "Dir::Cache::Archives=$APT_ARCHIVES")
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ${opts[@]+"${opts[@]}"} "$@" >&2
}

# proc_state PID: the one-letter state from /proc (R, S, T stopped, Z zombie...) or empty.
proc_state() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 0
  stat="${stat##*) }"
  printf '%s' "${stat%% *}"
}

# pid_of NAME: the pid recorded in .cache/run/NAME.pid, if any.
pid_of() {
  local f="$RUN/$1.pid"
  [[ -s "$f" ]] || return 1
  local pid
  pid="$(head -n1 "$f" | tr -dc '0-9')"
  [[ -n "$pid" ]] || return 1
  printf '%s' "$pid"
}

# alive NAME PATTERN: the recorded pid runs (not a zombie) and its command line contains PATTERN
# (guards against a recycled pid after a reboot or a kill -9).
alive() {
  local pid state
  pid="$(pid_of "$1")" || return 1
  state="$(proc_state "$pid")"
  [[ -n "$state" && "$state" != "Z" && "$state" != "X" ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$2"
}

# exited NAME: the process spawn recorded has ended (gone, or a zombie). For the start-up waits,
# where alive() can be wrong: until the forked shell execs the command, and while setsid, nohup
# and setpriv exec one another, /proc/PID/cmdline need not show the service's pattern yet. A
# fresh-clone CI run failed "pgbouncer exited during start-up" with PgBouncer up a moment later.
exited() {
  local pid state
  pid="$(pid_of "$1")" || return 0
  state="$(proc_state "$pid")"
  [[ -z "$state" || "$state" == "Z" || "$state" == "X" ]]
}

# paused NAME: the recorded process is stopped (SIGSTOP/SIGTSTP).
paused() {
  local pid
  pid="$(pid_of "$1")" || return 1
  [[ "$(proc_state "$pid")" == "T" || "$(proc_state "$pid")" == "t" ]]
}

# port_open PORT: something accepts TCP connections on 127.0.0.1:PORT.
port_open() {
  timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

# port_owner PORT: "pid=N (command)" of the listener, when ss can tell.
port_owner() {
  command -v ss >/dev/null 2>&1 || return 0
  ss -Hltnp "sport = :$1" 2>/dev/null | grep -o 'users:(([^)]*))' | head -n1 || true
}

# require_port_free SERVICE PORT LOGFILE
require_port_free() {
  if port_open "$2"; then
    fail "$1" "port 127.0.0.1:$2 is already taken by a process services.sh did not start $(port_owner "$2"); stop it (or the Debian cluster: pg_ctlcluster 15 main stop) and retry" "${3:-}"
  fi
}

# spawn NAME LOGFILE CMD...: start CMD detached from this shell (own session, no stdin, output
# appended to LOGFILE) and record its pid in .cache/run/NAME.pid.
spawn() {
  local name="$1" logfile="$2"
  shift 2
  mkdir -p "$(dirname "$logfile")"
  # keep one previous log around, so a crash-restart cycle still shows what happened before
  if [[ -s "$logfile" ]]; then mv -f "$logfile" "$logfile.1"; fi
  printf '=== %s: starting %s ===\n' "$(date -u +%FT%TZ)" "$*" >"$logfile"
  # A non-interactive bash puts background jobs in its own process group, so setsid(1) calls
  # setsid(2) and execs in place: $! is the service's own pid.
  # (9>&-: the service must not inherit services.sh's lock, or it would hold it forever)
  setsid nohup "$@" >>"$logfile" 2>&1 </dev/null 9>&- &
  local pid=$!
  printf '%s\n' "$pid" >"$RUN/$name.pid"
}

# stop_pid NAME PATTERN [GRACE_SECONDS]: SIGTERM the recorded process (SIGCONT too, in case it is
# paused), wait, then SIGKILL. Only ever the pid recorded by spawn and only if it still matches.
stop_pid() {
  local name="$1" pattern="$2" grace="${3:-30}" pid i
  if ! alive "$name" "$pattern"; then
    rm -f "$RUN/$name.pid"
    return 0
  fi
  pid="$(pid_of "$name")"
  kill -TERM "$pid" 2>/dev/null || true
  kill -CONT "$pid" 2>/dev/null || true
  for ((i = 0; i < grace * 5; i++)); do
    alive "$name" "$pattern" || break
    sleep 0.2
  done
  if alive "$name" "$pattern"; then
    log "$name: pid $pid ignored SIGTERM for ${grace}s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    sleep 0.5
  fi
  rm -f "$RUN/$name.pid"
}

# node_bin: the project's pinned Node (node_modules/.bin/node) or whatever node is on PATH.
node_bin() {
  if [[ -x "$ROOT/node_modules/.bin/node" ]]; then
    printf '%s' "$ROOT/node_modules/.bin/node"
  else
    command -v node || true
  fi
}

# file_hash FILE...: a stamp that changes when the given files change.
file_hash() { cat "$@" | sha256sum | cut -c1-16; }
