#!/usr/bin/env bash
# Builds the Lambda bundle and packages the CloudFormation template, fully offline.
#
#   bash scripts/package.sh [extra osls options, e.g. --param="reservedConcurrency=2"]
#
#   STAGE (default prod), REGION (default us-east-1): stage and region to package for.
#   PACKAGE_DIR (default .serverless): where osls writes the template.
#
# Output: .build/relay.zip (the function code) and $PACKAGE_DIR/cloudformation-template-update-stack.json.
# Packaging needs no AWS account. Dummy credentials are exported only so that nothing on the way
# goes looking for real ones (the instance metadata endpoint would just hang here); the ARNs
# below are placeholders with the right shape. Real values come from extra --param options,
# which override these defaults (osls takes the last --param of a name).
set -euo pipefail
cd "$(dirname "$0")/.."

STAGE="${STAGE:-prod}"
REGION="${REGION:-us-east-1}"
PACKAGE_DIR="${PACKAGE_DIR:-.serverless}"

# Never ask for real credentials, never phone home, never prompt.
export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION="$REGION"
export AWS_EC2_METADATA_DISABLED=true
unset AWS_PROFILE AWS_SESSION_TOKEN
export SLS_TELEMETRY_DISABLED=1 SLS_TRACKING_DISABLED=1 SLS_NOTIFICATIONS_MODE=off
export SLS_DEPRECATION_DISABLE='*' SLS_INTERACTIVE_SETUP_DISABLE=1 SLS_INTERACTIVE_SETUP_ENABLE=
export CI="${CI:-true}"

# Placeholders for the parameters that have no default, unless the caller gave them.
args=("$@")
has_param() { # name: was --param=name=… or --param name=… given?
  local i
  for ((i = 0; i < ${#args[@]}; i++)); do
    [[ "${args[i]}" == "--param=$1="* ]] && return 0
    [[ "${args[i]}" == --param && "${args[i + 1]:-}" == "$1="* ]] && return 0
  done
  return 1
}
placeholders=()
placeholder() { # name value
  if [[ "$STAGE" == local ]] || has_param "$1"; then return 0; fi
  placeholders+=(--param="$1=$2")
  echo "package.sh: no --param=$1=..., using the placeholder $2 (fine for inspection, not for a deploy)" >&2
}
placeholder databaseSecretArn "arn:aws:secretsmanager:${REGION}:123456789012:secret:outbox/database-AbCdEf"
placeholder kafkaBrokers "b-1.example.kafka.${REGION}.amazonaws.com:9096,b-2.example.kafka.${REGION}.amazonaws.com:9096"

rm -rf "$PACKAGE_DIR"
# osls runs scripts/build.mjs first (the scripts/serverless-build.cjs plugin in serverless.yml)
npx --no-install osls package --stage "$STAGE" --region "$REGION" --package "$PACKAGE_DIR" \
  ${placeholders[@]+"${placeholders[@]}"} "$@" </dev/null

template="$PACKAGE_DIR/cloudformation-template-update-stack.json"
test -s "$template" || { echo "package.sh: osls wrote no $template" >&2; exit 1; }
echo "packaged  $template  (stage $STAGE, region $REGION)"
echo "code      .build/relay.zip  $(wc -c <.build/relay.zip) bytes"
