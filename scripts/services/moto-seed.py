"""Seed the local AWS emulator with the secrets the relay reads (same as localstack/init).

Run by scripts/services/moto.sh with the moto venv's Python (boto3 comes with moto) right after
moto starts. Creates only what is missing, so a rotated value (PutSecretValue) is never reset.
"""
import json
import os

import boto3

SECRETS = {
    # RDS-style JSON, as AWS-managed database secrets look
    "outbox/database": {
        "engine": "postgres",
        "username": "outbox",
        "password": "outbox",
        "host": "127.0.0.1",
        "port": 5432,
        "dbname": "outbox",
    },
    # SASL credentials for KAFKA_SECRET_ID; the local broker is PLAINTEXT and ignores them
    "outbox/kafka": {
        "username": "outbox",
        "password": "outbox",
        "mechanism": "scram-sha-512",
    },
}

client = boto3.client(
    "secretsmanager",
    endpoint_url=os.environ.get("AWS_ENDPOINT_URL", "http://127.0.0.1:4566"),
    region_name=os.environ.get("AWS_REGION", "us-east-1"),
    aws_access_key_id="test",
    aws_secret_access_key="test",
)
for name, value in SECRETS.items():
    try:
        client.create_secret(Name=name, SecretString=json.dumps(value))
        print(f"moto-seed: created secret {name}")
    except client.exceptions.ResourceExistsException:
        print(f"moto-seed: secret {name} exists")
