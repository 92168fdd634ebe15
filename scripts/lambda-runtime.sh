#!/usr/bin/env bash
# A real AWS Lambda runtime on this machine, no Docker: what test/integration/lambda-runtime.test.ts
# runs the packaged zip under (.build/relay.zip, from scripts/build.mjs, the step `npm run package`
# runs first).
#
#   bash scripts/lambda-runtime.sh install   build/install both into .cache (idempotent, cached)
#   bash scripts/lambda-runtime.sh paths     print RIE=…, RIC=…, NODE=… (after install)
#
# - The AWS Lambda Runtime Interface Emulator (aws-lambda-rie): the Runtime API and the invoke
#   endpoint Lambda's own service provides; it reads AWS_LAMBDA_FUNCTION_TIMEOUT, hands the
#   runtime the invocation's deadline and kills the runtime at the timeout. A Go module built with
#   `go install` into .cache/lambda-rie (GOPATH, GOMODCACHE, GOCACHE and GOBIN there too). Its git
#   tags are not semver, so the version is the pseudo-version `@latest` resolved to (2026-11-30).
# - The Node runtime interface client (aws-lambda-ric, npm): the process Lambda's nodejs24.x image
#   runs, which loads LAMBDA_TASK_ROOT/handler.mjs and polls the Runtime API. Its install compiles
#   curl and aws-lambda-cpp (cmake, g++) and a Node addon against the running Node's headers, so it
#   is installed with the project's pinned Node 24 into .cache/lambda-ric, not as a devDependency:
#   every `npm ci` would otherwise compile native code for a minute, for a test-only tool, and
#   fail on machines without cmake.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=services/lib.sh
source "$ROOT/scripts/services/lib.sh"

RIE_MODULE="github.com/aws/aws-lambda-runtime-interface-emulator"
RIE_VERSION="v0.0.0-20261030222936-bef5c4ba774d"
RIE_DIR="$CACHE/lambda-rie"
RIE_BIN="$RIE_DIR/bin/aws-lambda-rie"
RIC_SPEC="aws-lambda-ric@4.0.2"
RIC_DIR="$CACHE/lambda-ric"
RIC_ENTRY="$RIC_DIR/node_modules/aws-lambda-ric/index.mjs"

# the runtime's Node: the project's pinned Node 24 (nodejs24.x), never whatever is first on PATH
NODE="$ROOT/node_modules/node/bin/node"

rie_install() {
  local stamp="$RIE_DIR/.stamp"
  if [[ -x "$RIE_BIN" && "$(cat "$stamp" 2>/dev/null)" == "$RIE_VERSION" ]]; then return 0; fi
  command -v go >/dev/null 2>&1 ||
    fail lambda-rie "Go is needed to build the Lambda Runtime Interface Emulator and was not found on PATH; install Go 1.21+ (https://go.dev/dl/; with GOTOOLCHAIN=auto it fetches the newer toolchain the emulator asks for)" ""
  mkdir -p "$RIE_DIR"
  log "lambda-rie: go install $RIE_MODULE/cmd/aws-lambda-rie@$RIE_VERSION into $RIE_DIR"
  # -modcacherw: the module cache stays deletable with rm -rf .cache; CGO off: a static binary
  if ! env GOPATH="$RIE_DIR/gopath" GOMODCACHE="$RIE_DIR/gomodcache" GOCACHE="$RIE_DIR/gocache" GOBIN="$RIE_DIR/bin" \
    GOFLAGS=-modcacherw CGO_ENABLED=0 GOTOOLCHAIN="${GOTOOLCHAIN:-auto}" \
    go install "$RIE_MODULE/cmd/aws-lambda-rie@$RIE_VERSION" >"$RIE_DIR/install.log" 2>&1; then
    fail lambda-rie "go install of the emulator failed (network to the Go module proxy? GOPROXY=$(go env GOPROXY))" "$RIE_DIR/install.log"
  fi
  printf '%s' "$RIE_VERSION" >"$stamp"
}

ric_install() {
  [[ -x "$NODE" ]] || fail lambda-ric "the pinned Node ($NODE) is missing: run npm ci first" ""
  local stamp="$RIC_DIR/.stamp" want
  # the addon is built for one Node ABI: a new pinned Node means a new build
  want="$RIC_SPEC node $("$NODE" --version)"
  if [[ -f "$RIC_ENTRY" && "$(cat "$stamp" 2>/dev/null)" == "$want" ]]; then return 0; fi
  local missing=()
  command -v cmake >/dev/null 2>&1 || command -v cmake3 >/dev/null 2>&1 || missing+=(cmake)
  command -v g++ >/dev/null 2>&1 || missing+=(g++)
  command -v make >/dev/null 2>&1 || missing+=(make)
  command -v python3 >/dev/null 2>&1 || missing+=(python3)
  if ((${#missing[@]})); then
    apt_install "${missing[@]}" || fail lambda-ric "aws-lambda-ric compiles native code and needs: ${missing[*]} (could not install them through apt)" ""
  fi
  mkdir -p "$RIC_DIR"
  printf '{ "name": "outbox-relay-lambda-ric", "private": true, "description": "installed by scripts/lambda-runtime.sh" }\n' >"$RIC_DIR/package.json"
  log "lambda-ric: npm install $RIC_SPEC into $RIC_DIR with Node $("$NODE" --version) (compiles native code, about a minute)"
  # npm runs the package's install scripts with the node first on PATH: the pinned one
  if ! (cd "$RIC_DIR" && PATH="$(dirname "$NODE"):$PATH" npm_config_cache="$CACHE/npm" \
    npm install --no-audit --no-fund --no-save "$RIC_SPEC" >"$RIC_DIR/install.log" 2>&1); then
    fail lambda-ric "npm install $RIC_SPEC failed" "$RIC_DIR/install.log"
  fi
  [[ -f "$RIC_DIR/node_modules/aws-lambda-ric/rapid-client.node" ]] ||
    fail lambda-ric "npm install $RIC_SPEC finished without building its native addon (rapid-client.node); were install scripts disabled (npm's ignore-scripts or allowScripts)?" "$RIC_DIR/install.log"
  printf '%s' "$want" >"$stamp"
}

case "${1:-}" in
  install)
    # one install at a time (two test runs racing would both compile)
    exec 8>"$RUN/.lambda-runtime.lock"
    flock -w 900 8 || fail lambda-runtime "another install has held $RUN/.lambda-runtime.lock for 15 minutes" ""
    rie_install
    ric_install
    ;;
  paths)
    printf 'RIE=%s\nRIC=%s\nNODE=%s\n' "$RIE_BIN" "$RIC_ENTRY" "$NODE"
    ;;
  *)
    sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
