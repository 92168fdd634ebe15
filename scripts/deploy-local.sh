#!/usr/bin/env bash
# Creates (or updates) the packaged stack on the local AWS emulator's CloudFormation, the way a
# deploy to AWS does, and prints what it is made of as the services report it.
#
#   npm run deploy:local [-- extra osls options, e.g. --param="kmsKeyArn=..."]
#   bash scripts/deploy-local.sh remove          removes the stack (and empties its bucket)
#
#   AWS_ENDPOINT_URL (default http://localhost:4566: moto only reads templates from S3 URLs that say
#     localhost), AWS_REGION (us-east-1), AWS_ACCESS_KEY_ID (test; moto takes a 12-digit one as the
#     account, which keeps one run's resources apart from another's), PACKAGE_DIR (.serverless).
#
# Steps: scripts/package.sh for the `local` stage (params.local), `osls deploy --package` of that
# directory (the serverless-localstack plugin points the framework at the emulator), then
# scripts/stack-inventory.py with the emulator's boto3 (.cache/moto-venv) into
# $PACKAGE_DIR/stack-inventory.json, also printed.
set -euo pipefail
cd "$(dirname "$0")/.."

export AWS_ENDPOINT_URL="${AWS_ENDPOINT_URL:-http://localhost:4566}"
export AWS_REGION="${AWS_REGION:-us-east-1}" AWS_DEFAULT_REGION="${AWS_REGION:-us-east-1}"
export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-test}" AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-test}"
export AWS_EC2_METADATA_DISABLED=true SLS_TELEMETRY_DISABLED=1 SLS_TRACKING_DISABLED=1 SLS_NOTIFICATIONS_MODE=off
export SLS_DEPRECATION_DISABLE='*' SLS_INTERACTIVE_SETUP_DISABLE=1 CI="${CI:-true}"
unset AWS_PROFILE AWS_SESSION_TOKEN
PACKAGE_DIR="${PACKAGE_DIR:-.serverless}"
PY="$(readlink -f .cache 2>/dev/null || echo .cache)/moto-venv/bin/python"
[[ -x "$PY" ]] || { echo "deploy-local: $PY missing: run npm run services:up (it installs the emulator)" >&2; exit 1; }
curl -fsS -o /dev/null --max-time 5 "$AWS_ENDPOINT_URL/moto-api/" 2>/dev/null ||
  curl -fsS -o /dev/null --max-time 5 "$AWS_ENDPOINT_URL/_localstack/health" 2>/dev/null ||
  { echo "deploy-local: no emulator answers at $AWS_ENDPOINT_URL (npm run services:up)" >&2; exit 1; }

if [[ "${1:-}" == remove ]]; then
  shift
  exec npx --no-install osls remove --stage local --region "$AWS_REGION" "$@" </dev/null
fi

STAGE=local REGION="$AWS_REGION" PACKAGE_DIR="$PACKAGE_DIR" bash scripts/package.sh "$@"
npx --no-install osls deploy --stage local --region "$AWS_REGION" --package "$PACKAGE_DIR" "$@" </dev/null
"$PY" scripts/stack-inventory.py outbox-relay-local >"$PACKAGE_DIR/stack-inventory.json"
cat "$PACKAGE_DIR/stack-inventory.json"
