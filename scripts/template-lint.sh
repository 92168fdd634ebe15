#!/usr/bin/env bash
# What an AWS reviewer runs on the packaged CloudFormation template: cfn-lint (with the
# cfn-lint-serverless rules) and checkov, each pinned, each in a venv of its own under
# .cache/template-lint (git-ignored; pip's downloads cached in .cache/pip), installed once.
#
#   bash scripts/template-lint.sh install            install both (a no-op once installed; CI runs it first)
#   bash scripts/template-lint.sh check TEMPLATE...  both linters on each template; exit 1 on any finding
#   bash scripts/template-lint.sh cfn-lint ARGS...   the pinned cfn-lint itself (installs first)
#   bash scripts/template-lint.sh checkov ARGS...    the pinned checkov itself (installs first)
#
# Two venvs, because checkov brings its own cfn-lint requirement and must not move the pinned one.
# What each linter is told to skip, and why, is in serverless.yml (Metadata cfn-lint/checkov of
# each resource) and in .checkov.yml / .cfnlintrc.yaml beside this project's root.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# resolved: worktrees that share one .cache (a symlink) share one install
CACHE="$(readlink -f "$ROOT/.cache" 2>/dev/null || printf '%s' "$ROOT/.cache")"
DIR="$CACHE/template-lint"

CFN_LINT_SPEC=(cfn-lint==1.58.0 cfn-lint-serverless==0.3.6)
CHECKOV_SPEC=(checkov==3.3.30)

die() { printf 'template-lint: %s\n' "$*" >&2; exit 1; }

# venv NAME SPEC...: DIR/NAME holds exactly SPEC (its stamp says so), else it is made again.
venv() {
  local name="$1"; shift
  local dest="$DIR/$name" want="$*"
  [[ -x "$dest/bin/python" && "$(cat "$dest/.stamp" 2>/dev/null)" == "$want" ]] && return 0
  local py
  py="$(command -v python3 || true)"
  [[ -n "$py" ]] || die "python3 is needed (apt-get install python3 python3-venv)"
  printf 'template-lint: installing %s into %s\n' "$want" "$dest" >&2
  # in place (a venv's scripts name their interpreter by absolute path); the stamp, written last,
  # marks a complete install, so an interrupted one is made again
  rm -rf "$dest"
  "$py" -m venv "$dest" >"$DIR/$name.log" 2>&1 || die "python3 -m venv failed (on Debian: apt-get install python3-venv); log $DIR/$name.log"
  if ! PIP_CACHE_DIR="$CACHE/pip" PIP_DISABLE_PIP_VERSION_CHECK=1 "$dest/bin/pip" install -q "$@" >>"$DIR/$name.log" 2>&1; then
    tail -n 30 "$DIR/$name.log" >&2
    die "pip install $want failed; log $DIR/$name.log"
  fi
  printf '%s' "$want" >"$dest/.stamp"
}

install() {
  mkdir -p "$DIR"
  # one installer at a time: test files run several at once
  exec 8>"$DIR/.lock"
  flock -w 900 8 || die "another install has held $DIR/.lock for 15 minutes"
  venv cfn-lint "${CFN_LINT_SPEC[@]}"
  venv checkov "${CHECKOV_SPEC[@]}"
  exec 8>&-
}

cfn_lint() { "$DIR/cfn-lint/bin/cfn-lint" --append-rules cfn_lint_serverless.rules "$@"; }
# no network: no version check, no Prisma Cloud platform, no downloads of external checks
run_checkov() {
  BC_SKIP_MAPPING=TRUE CHECKOV_RUN_SCA_PACKAGE_SCAN_V2=false \
    "$DIR/checkov/bin/checkov" --skip-download --framework cloudformation "$@"
}

cmd="${1:-}"; shift || true
case "$cmd" in
  install) install ;;
  cfn-lint) install; cfn_lint "$@" ;;
  checkov) install; run_checkov "$@" ;;
  check)
    (($# > 0)) || die "check needs at least one template"
    install
    status=0
    for t in "$@"; do
      printf '== cfn-lint %s\n' "$t"
      cfn_lint -- "$t" || status=1
      printf '== checkov %s\n' "$t"
      run_checkov --compact --quiet -f "$t" || status=1
    done
    exit "$status"
    ;;
  *) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
