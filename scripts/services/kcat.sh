# shellcheck shell=bash
# kcat (librdkafka's command-line client) for tests that must read the topic as a consumer other
# than the relay's own clients would: librdkafka is a third Kafka implementation, and its
# `isolation.level=read_committed` is the reader that exactly-once (issue 36) is judged by
# (test/integration/kcat.test.ts).
#
#   bash scripts/services/kcat.sh      install if needed; print the wrapper's path (.cache/kcat/kcat)
#   (sourced by services.sh, whose `up` runs kcat_install whenever Kafka is among the services)
#
# Debian's packages, fetched with `apt-get download` (no root, no apt-get install: CI machines need
# not allow either) into .cache/kcat/debs and unpacked with `dpkg -x` into .cache/kcat/root. The
# wrapper .cache/kcat/kcat points LD_LIBRARY_PATH at the unpacked libraries and execs the binary.
# librdkafka's own dependencies (libssl, libsasl2, lz4, zstd, zlib) are on most base systems; any
# that ldd cannot find are downloaded and unpacked beside it.

if [[ -z "${CACHE:-}" ]]; then
  # shellcheck source=lib.sh
  source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
fi

KCAT_DIR="$CACHE/kcat"
KCAT_BIN="$KCAT_DIR/kcat"
KCAT_PACKAGES=(kcat librdkafka1 libyajl2)
# a change here (or to how the wrapper is written) installs again
KCAT_STAMP="v1 ${KCAT_PACKAGES[*]}"

# kcat_download DIR PKG...: the .debs into DIR (apt-get download writes to the working directory).
kcat_download() {
  local dir="$1" opts=()
  shift
  # as root, apt drops to the _apt user to download, who cannot write into .cache: stay root
  if is_root; then opts=(-o APT::Sandbox::User=root); fi
  (cd "$dir" && apt-get download ${opts[@]+"${opts[@]}"} "$@") >>"$KCAT_DIR/download.log" 2>&1
}

# kcat_missing_libs ROOT: the shared libraries the unpacked kcat still cannot find, one a line.
kcat_missing_libs() {
  local root="$1" libdir
  libdir="$(kcat_libdirs "$root")"
  LD_LIBRARY_PATH="$libdir" ldd "$root/usr/bin/kcat" 2>/dev/null | awk '/not found/ {print $1}'
}

# kcat_libdirs ROOT: every unpacked directory holding a shared library, colon-separated.
kcat_libdirs() {
  find "$1" -name '*.so*' -printf '%h\n' 2>/dev/null | sort -u | paste -sd:
}

kcat_install() {
  if [[ -x "$KCAT_BIN" && "$(cat "$KCAT_DIR/.stamp" 2>/dev/null)" == "$KCAT_STAMP" ]]; then
    return 0
  fi
  mkdir -p "$KCAT_DIR"
  # Its own lock: services.sh's lock is held for a whole `up`, and a test may run this directly.
  # (a subshell, so the lock's descriptor closes when the install ends)
  (
    exec 8>"$KCAT_DIR/.lock"
    flock -w 300 8 || fail kcat "another install has held $KCAT_DIR/.lock for 5 minutes" ""
    if [[ -x "$KCAT_BIN" && "$(cat "$KCAT_DIR/.stamp" 2>/dev/null)" == "$KCAT_STAMP" ]]; then
      exit 0
    fi
    command -v apt-get >/dev/null 2>&1 && command -v dpkg >/dev/null 2>&1 ||
      fail kcat "apt-get and dpkg are needed to fetch Debian's kcat package and were not found" ""
    log "kcat: downloading Debian's ${KCAT_PACKAGES[*]} into $KCAT_DIR/debs"
    local debs="$KCAT_DIR/debs" root="$KCAT_DIR/root.tmp" deb missing pkgs
    rm -rf "$debs" "$root" "$KCAT_DIR/download.log"
    mkdir -p "$debs" "$root"
    kcat_download "$debs" "${KCAT_PACKAGES[@]}" ||
      fail kcat "apt-get download ${KCAT_PACKAGES[*]} failed (no network, or the package lists are stale: apt-get update)" "$KCAT_DIR/download.log"
    for deb in "$debs"/*.deb; do dpkg -x "$deb" "$root" || fail kcat "dpkg -x $deb failed" ""; done
    missing="$(kcat_missing_libs "$root")"
    if [[ -n "$missing" ]]; then
      # the packages that ship them: librdkafka1's and kcat's dependencies, as apt names them
      pkgs="$(apt-cache depends "${KCAT_PACKAGES[@]}" 2>/dev/null |
        awk -v have="libc6 ${KCAT_PACKAGES[*]}" 'BEGIN { split(have, h, " "); for (i in h) skip[h[i]] = 1 }
          $1 == "Depends:" && $2 !~ /^</ && !skip[$2] { print $2 }' | sort -u)" || true
      log "kcat: the base system lacks $(echo "$missing" | paste -sd' '); downloading $(echo "$pkgs" | paste -sd' ')"
      # shellcheck disable=SC2086 # one package a word
      [[ -n "$pkgs" ]] && kcat_download "$debs" $pkgs ||
        fail kcat "apt-get download of kcat's dependencies failed" "$KCAT_DIR/download.log"
      for deb in "$debs"/*.deb; do dpkg -x "$deb" "$root" || fail kcat "dpkg -x $deb failed" ""; done
      missing="$(kcat_missing_libs "$root")"
      [[ -z "$missing" ]] || fail kcat "kcat still cannot find $(echo "$missing" | paste -sd' ') after unpacking its dependencies" ""
    fi
    rm -rf "$KCAT_DIR/root"
    mv "$root" "$KCAT_DIR/root"
    # the library path is relative to the wrapper, so the cache may move
    local rel
    rel="$(kcat_libdirs "$KCAT_DIR/root" | sed "s|$KCAT_DIR/|\$here/|g")"
    cat >"$KCAT_BIN.tmp" <<EOF
#!/bin/sh
# Written by scripts/services/kcat.sh: Debian's kcat unpacked under root/, with its libraries.
here="\$(dirname "\$(readlink -f "\$0")")"
LD_LIBRARY_PATH="$rel\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$here/root/usr/bin/kcat" "\$@"
EOF
    chmod 755 "$KCAT_BIN.tmp"
    "$KCAT_BIN.tmp" -V >"$KCAT_DIR/version.txt" 2>&1 || fail kcat "the unpacked kcat does not run" "$KCAT_DIR/version.txt"
    mv -f "$KCAT_BIN.tmp" "$KCAT_BIN"
    printf '%s\n' "$KCAT_STAMP" >"$KCAT_DIR/.stamp"
    log "kcat: $(grep -m1 -o 'Version [^ ]*' "$KCAT_DIR/version.txt") installed at $KCAT_BIN"
  )
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  kcat_install
  printf '%s\n' "$KCAT_BIN"
fi
