#!/bin/sh
# The local secrets the relay reads (DATABASE_SECRET_ID / KAFKA_SECRET_ID). Values are for a
# relay running on the host, where the services are on 127.0.0.1. Creates only what is missing,
# so a rotated value (PutSecretValue) survives a re-run.
#  - LocalStack runs this file itself from /etc/localstack/init/ready.d (with awslocal).
#  - The moto profile runs it in the moto-init container (aws CLI, AWS_CMD=aws, AWS_ENDPOINT_URL).
#  - Without Docker, scripts/services/moto-seed.py creates the same secrets.
set -eu
AWS="${AWS_CMD:-awslocal}"

create() {
  if $AWS secretsmanager describe-secret --secret-id "$1" >/dev/null 2>&1; then
    echo "secret $1 exists"
  else
    $AWS secretsmanager create-secret --name "$1" --secret-string "$2" >/dev/null
    echo "created secret $1"
  fi
}

# RDS-style JSON, as AWS-managed database secrets look
create outbox/database '{"engine":"postgres","username":"outbox","password":"outbox","host":"127.0.0.1","port":5432,"dbname":"outbox"}'
# SASL credentials for KAFKA_SECRET_ID; the local broker is PLAINTEXT and ignores them
create outbox/kafka '{"username":"outbox","password":"outbox","mechanism":"scram-sha-512"}'
