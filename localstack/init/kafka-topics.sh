#!/bin/sh
# The demo topic (auto.create.topics.enable=false). Run by the kafka-init container, which shares
# the broker's network namespace. Without Docker, scripts/services/kafka-ready.mjs creates it.
set -eu
/opt/kafka/bin/kafka-topics.sh --bootstrap-server 127.0.0.1:9092 --create --if-not-exists \
  --topic outbox.event.order --partitions 3 --replication-factor 1
