#!/usr/bin/env bash
# Resolves Kafka Connect + Debezium's Postgres connector (scripts/debezium/pom.xml) from Maven
# Central into .cache/debezium/libs, the way scripts/services/kafka.sh resolves the broker. A no-op
# when the jars of this pom are already there (a stamp of the pom's hash), so it runs on every
# `npm run bench -- --peer debezium` and downloads only the first time. Only the bench calls it:
# tests and CI never need Debezium.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=../services/lib.sh
source "$ROOT/scripts/services/lib.sh"
# shellcheck source=../services/kafka.sh
source "$SERVICES_DIR/kafka.sh" # kafka_java_ok: Connect 4.x needs Java 17 like the broker

DBZ_DIR="$CACHE/debezium"
DBZ_LIBS="$DBZ_DIR/libs"
DBZ_POM="$ROOT/scripts/debezium/pom.xml"

kafka_java_ok || fail debezium "Java 17+ is required to run Kafka Connect 4.3 and Debezium 3.6 and none was found (apt-get install openjdk-17-jre-headless)" ""
stamp="$(file_hash "$DBZ_POM")"
if [[ -f "$DBZ_LIBS/.stamp" && "$(cat "$DBZ_LIBS/.stamp")" == "$stamp" ]]; then
  exit 0
fi
command -v mvn >/dev/null 2>&1 || fail debezium "Maven is needed once to fetch Debezium's jars and was not found (apt-get install maven)" ""
log "debezium: resolving Kafka Connect + Debezium jars from Maven Central (scripts/debezium/pom.xml) into $DBZ_LIBS"
mkdir -p "$DBZ_DIR"
rm -rf "$DBZ_LIBS.tmp"
# Into a temporary directory, then renamed: an interrupted download never looks complete.
if ! mvn -B -q -Dstyle.color=never -Dmaven.repo.local="$CACHE/m2" -f "$DBZ_POM" \
  org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
  -DincludeScope=runtime -DoutputDirectory="$DBZ_LIBS.tmp" >"$DBZ_DIR/mvn.log" 2>&1; then
  fail debezium "mvn dependency:copy-dependencies failed" "$DBZ_DIR/mvn.log"
fi
rm -rf "$DBZ_LIBS"
mv "$DBZ_LIBS.tmp" "$DBZ_LIBS"
printf '%s\n' "$stamp" >"$DBZ_LIBS/.stamp"
log "debezium: $(find "$DBZ_LIBS" -name '*.jar' | wc -l) jars in $DBZ_LIBS"
