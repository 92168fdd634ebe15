# shellcheck shell=bash
# Apache Kafka on 127.0.0.1:9092: one JVM, KRaft mode, combined broker+controller (controller on
# 127.0.0.1:9093, never advertised to clients), run from Kafka's own jars as published on Maven
# Central (resolved by scripts/kafka/pom.xml, which also pins the version and says why).
#
# Listeners (all on 127.0.0.1):
#   9092  PLAINTEXT      clients and inter-broker
#   9093  CONTROLLER     KRaft controller
#   9094  SASL_PLAINTEXT SCRAM-SHA-256/512, user relay / relay-secret (created by `up`)
#   9095  PROXIED        plaintext, ADVERTISED as 9096
#   9097  SASL_PROXIED   SCRAM, ADVERTISED as 9098
#   9099  SSL            TLS, the certificate of scripts/services/tls.sh (trust .cache/tls/ca.pem)
#   9100  SASL_SSL       SCRAM over TLS
# Nothing listens on 9096/9098 unless a test starts a proxy there (test/integration/kafka-proxy.ts):
# a client reconnects to the address it gets in metadata, so advertising the proxy's port makes
# every connection of a client bootstrapped at 9096 (9098) go through the proxy, which lets a test
# lose a Produce answer the broker has already acted on.
#
# The broker's pid is in .cache/run/kafka.pid, for tests that pause/kill it:
#   kill -STOP "$(cat .cache/run/kafka.pid)"   # hang (status still says up: it is not "down")
#   kill -9    "$(cat .cache/run/kafka.pid)"   # crash
#   bash scripts/services.sh up kafka          # starts it again only if it is dead (resumes a paused one)
#   bash scripts/services.sh restart kafka     # clean stop + start

KAFKA_PORT=9092
KAFKA_CONTROLLER_PORT=9093
KAFKA_SASL_PORT=9094
KAFKA_PROXIED_PORT=9095      # advertised as KAFKA_PROXY_PORT
KAFKA_PROXY_PORT=9096
KAFKA_SASL_PROXIED_PORT=9097 # advertised as KAFKA_SASL_PROXY_PORT
KAFKA_SASL_PROXY_PORT=9098
KAFKA_SSL_PORT=9099
KAFKA_SASL_SSL_PORT=9100
KAFKA_SCRAM_USER=relay
KAFKA_SCRAM_PASSWORD=relay-secret
KAFKA_DIR="$CACHE/kafka"
KAFKA_LIBS="$KAFKA_DIR/libs"
KAFKA_DATA="$KAFKA_DIR/data"
KAFKA_LOG="$KAFKA_DIR/broker.log"
KAFKA_POM="$ROOT/scripts/kafka/pom.xml"
KAFKA_PATTERN="kafka.Kafka $KAFKA_DIR/server.properties"
KAFKA_HEAP="${KAFKA_HEAP:-512m}"
KAFKA_TOPICS=(outbox.event.order:3)

kafka_java_ok() {
  command -v java >/dev/null 2>&1 || return 1
  local v
  v="$(java -version 2>&1 | head -n1 | sed -E 's/.*version "([0-9]+).*/\1/')"
  [[ "$v" =~ ^[0-9]+$ && "$v" -ge 17 ]]
}

kafka_install() {
  if ! kafka_java_ok; then
    apt_install openjdk-17-jre-headless || true
    kafka_java_ok || fail kafka "Java 17+ is required to run the Kafka 4 broker and none was found (apt-get install openjdk-17-jre-headless)" ""
  fi
  local stamp
  stamp="$(file_hash "$KAFKA_POM")"
  if [[ -f "$KAFKA_LIBS/.stamp" && "$(cat "$KAFKA_LIBS/.stamp")" == "$stamp" ]]; then
    return 0
  fi
  if ! command -v mvn >/dev/null 2>&1; then
    apt_install maven || true
    command -v mvn >/dev/null 2>&1 || fail kafka "Maven is needed once to fetch Kafka's jars and was not found (apt-get install maven)" ""
  fi
  log "kafka: resolving jars from Maven Central (scripts/kafka/pom.xml) into $KAFKA_LIBS"
  mkdir -p "$KAFKA_DIR"
  rm -rf "$KAFKA_LIBS.tmp"
  # Full plugin coordinates: the prefix form would resolve whatever maven-dependency-plugin the
  # local Maven defaults to. Its local repository is under .cache too.
  if ! mvn -B -q -Dstyle.color=never -Dmaven.repo.local="$CACHE/m2" -f "$KAFKA_POM" \
    org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$KAFKA_LIBS.tmp" >"$KAFKA_DIR/mvn.log" 2>&1; then
    fail kafka "mvn dependency:copy-dependencies failed" "$KAFKA_DIR/mvn.log"
  fi
  rm -rf "$KAFKA_LIBS"
  mv "$KAFKA_LIBS.tmp" "$KAFKA_LIBS"
  printf '%s\n' "$stamp" >"$KAFKA_LIBS/.stamp"
}

kafka_write_conf() {
  mkdir -p "$KAFKA_DIR" "$KAFKA_DATA"
  cat >"$KAFKA_DIR/server.properties" <<EOF
# Written by scripts/services/kafka.sh on every start. Single node, KRaft, broker+controller.
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT,SASL_PLAINTEXT://127.0.0.1:$KAFKA_SASL_PORT,PROXIED://127.0.0.1:$KAFKA_PROXIED_PORT,SASL_PROXIED://127.0.0.1:$KAFKA_SASL_PROXIED_PORT,SSL://127.0.0.1:$KAFKA_SSL_PORT,SASL_SSL://127.0.0.1:$KAFKA_SASL_SSL_PORT
# PROXIED and SASL_PROXIED advertise the port of a test's proxy, not their own (see the top of kafka.sh)
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,SASL_PLAINTEXT://127.0.0.1:$KAFKA_SASL_PORT,PROXIED://127.0.0.1:$KAFKA_PROXY_PORT,SASL_PROXIED://127.0.0.1:$KAFKA_SASL_PROXY_PORT,SSL://127.0.0.1:$KAFKA_SSL_PORT,SASL_SSL://127.0.0.1:$KAFKA_SASL_SSL_PORT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,PROXIED:PLAINTEXT,SASL_PROXIED:SASL_PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL
# the SSL and SASL_SSL listeners' certificate and key (scripts/services/tls.sh); no client certificates
ssl.keystore.type=PEM
ssl.keystore.location=$TLS_DIR/kafka-keystore.pem
# SCRAM on both SASL listeners; the credentials live in the cluster metadata (KafkaScram.java)
sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512
listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_proxied.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_proxied.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
log.dirs=$KAFKA_DATA
num.partitions=3
default.replication.factor=1
auto.create.topics.enable=false
min.insync.replicas=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# a test box: keep segments small and let old data go
log.retention.hours=24
log.segment.bytes=67108864
# Tests kill the broker and start it again. A restart replays the metadata log since the last
# snapshot (every topic a test created or deleted, every producer id block): by default that is up
# to 20 MB or an hour of records, a minute of replay on a busy test box. Snapshot often instead.
metadata.log.max.record.bytes.between.snapshots=1048576
metadata.log.max.snapshot.interval.ms=60000
num.recovery.threads.per.data.dir=2
EOF
  cat >"$KAFKA_DIR/log4j2.properties" <<'EOF'
# Broker log to stdout (captured in .cache/kafka/broker.log); INFO for the server, WARN for noise.
status = warn
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = STDOUT
logger.controller.name = org.apache.kafka.controller
logger.controller.level = WARN
logger.coordinator.name = org.apache.kafka.coordinator
logger.coordinator.level = WARN
logger.raft.name = org.apache.kafka.raft
logger.raft.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
logger.log.name = org.apache.kafka.storage.internals.log
logger.log.level = WARN
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = WARN
EOF
}

KAFKA_JVM=(java -Xmx"$KAFKA_HEAP" -Xms128m -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true
  -Dlog4j2.configurationFile="$KAFKA_DIR/log4j2.properties" -cp "$KAFKA_LIBS/*")

kafka_java() { "${KAFKA_JVM[@]}" "$@"; }

kafka_format() {
  [[ -f "$KAFKA_DATA/meta.properties" ]] && return 0
  local cluster_id
  log "kafka: formatting storage $KAFKA_DATA (KRaft, standalone controller)"
  cluster_id="$(kafka_java kafka.tools.StorageTool random-uuid 2>>"$KAFKA_DIR/format.log" | tail -n1)" ||
    fail kafka "kafka.tools.StorageTool random-uuid failed" "$KAFKA_DIR/format.log"
  if ! kafka_java kafka.tools.StorageTool format --standalone -t "$cluster_id" \
    -c "$KAFKA_DIR/server.properties" >>"$KAFKA_DIR/format.log" 2>&1; then
    fail kafka "kafka.tools.StorageTool format failed" "$KAFKA_DIR/format.log"
  fi
}

# kafka_ready TIMEOUT_MS [--warm-up]: metadata answered (and the demo topic exists).
kafka_ready() {
  local node
  node="$(node_bin)"
  if [[ -z "$node" || ! -d "$ROOT/node_modules/kafkajs" ]]; then
    # No kafkajs yet (npm install not run): the broker's own "started" line is the next best sign.
    port_open "$KAFKA_PORT" && grep -q 'Kafka Server started' "$KAFKA_LOG" 2>/dev/null
    return
  fi
  local args=(--timeout-ms "${1:-5000}" "${@:2}")
  local t
  for t in "${KAFKA_TOPICS[@]}"; do args+=(--ensure-topic "$t"); done
  "$node" "$SERVICES_DIR/kafka-ready.mjs" "${args[@]}" >>"$KAFKA_DIR/health.log" 2>&1
}

# What the status and log lines say about the listeners besides 9092.
KAFKA_LISTENERS_NOTE="SASL/SCRAM 127.0.0.1:$KAFKA_SASL_PORT; proxied $KAFKA_PROXIED_PORT→$KAFKA_PROXY_PORT, SASL $KAFKA_SASL_PROXIED_PORT→$KAFKA_SASL_PROXY_PORT; SSL $KAFKA_SSL_PORT, SASL_SSL $KAFKA_SASL_SSL_PORT"

# kafka_scram_user: the SCRAM user of the SASL listeners, both mechanisms. The credential lives in
# the cluster metadata (it survives restarts), so this is an upsert that runs on every `up`: it
# never fails because the user exists, and it RESETS the password to relay-secret, which also undoes
# a test that rotated it (setScramPassword) and died before putting it back. ~2 s, mostly the JVM.
kafka_scram_user() {
  if ! java -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -cp "$KAFKA_LIBS/*" "$SERVICES_DIR/KafkaScram.java" \
    --bootstrap "127.0.0.1:$KAFKA_PORT" --user "$KAFKA_SCRAM_USER" --password "$KAFKA_SCRAM_PASSWORD" \
    --verify "127.0.0.1:$KAFKA_SASL_PORT" >>"$KAFKA_DIR/scram.log" 2>&1; then
    fail kafka "creating the SCRAM user $KAFKA_SCRAM_USER failed (scripts/services/KafkaScram.java)" "$KAFKA_DIR/scram.log"
  fi
}

# kafka_current: the running broker has every listener and the keystore tls.sh made last.
kafka_current() {
  local port
  for port in "$KAFKA_SASL_PORT" "$KAFKA_PROXIED_PORT" "$KAFKA_SASL_PROXIED_PORT" "$KAFKA_SSL_PORT" "$KAFKA_SASL_SSL_PORT"; do
    port_open "$port" || return 1
  done
  [[ "$(cat "$KAFKA_DIR/keystore.stamp" 2>/dev/null)" == "$(file_hash "$TLS_DIR/kafka-keystore.pem")" ]]
}

kafka_up() {
  if alive kafka "$KAFKA_PATTERN"; then
    if paused kafka; then
      log "kafka: pid $(pid_of kafka) was stopped (SIGSTOP); sending SIGCONT"
      kill -CONT "$(pid_of kafka)"
    fi
    if kafka_ready 15000 && kafka_current; then
      kafka_scram_user
      log "kafka: already up (pid $(pid_of kafka), 127.0.0.1:$KAFKA_PORT; $KAFKA_LISTENERS_NOTE)"
      return 0
    fi
    if kafka_ready 1000; then
      # started with an older config (before a listener existed) or an older certificate: listeners
      # and keystore are read at start only, so restart it, once (`up` runs before any test does)
      log "kafka: pid $(pid_of kafka) runs an older config (a listener closed or a new certificate since); restarting it"
      kafka_down
      kafka_up
      return
    fi
    fail kafka "pid $(pid_of kafka) runs but does not answer metadata requests on 127.0.0.1:$KAFKA_PORT (health: $KAFKA_DIR/health.log); try: bash scripts/services.sh restart kafka" "$KAFKA_LOG"
  fi
  rm -f "$RUN/kafka.pid"
  kafka_install
  kafka_write_conf
  kafka_format
  file_hash "$TLS_DIR/kafka-keystore.pem" >"$KAFKA_DIR/keystore.stamp"
  local port
  for port in "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT" "$KAFKA_SASL_PORT" "$KAFKA_PROXIED_PORT" "$KAFKA_SASL_PROXIED_PORT" "$KAFKA_SSL_PORT" "$KAFKA_SASL_SSL_PORT"; do
    require_port_free kafka "$port" "$KAFKA_LOG"
  done
  log "kafka: starting broker+controller (log $KAFKA_LOG)"
  spawn kafka "$KAFKA_LOG" "${KAFKA_JVM[@]}" kafka.Kafka "$KAFKA_DIR/server.properties"
  local deadline=$((SECONDS + 120))
  while ((SECONDS < deadline)); do
    exited kafka && fail kafka "the broker process exited during start-up" "$KAFKA_LOG"
    if port_open "$KAFKA_PORT"; then break; fi
    sleep 0.3
  done
  port_open "$KAFKA_PORT" || fail kafka "127.0.0.1:$KAFKA_PORT not open after 120s" "$KAFKA_LOG"
  if ! kafka_ready $(((deadline - SECONDS) * 1000 + 1000)) --warm-up; then
    exited kafka && fail kafka "the broker process exited during start-up" "$KAFKA_LOG"
    fail kafka "port $KAFKA_PORT is open but the broker does not answer metadata requests (health: $KAFKA_DIR/health.log)" "$KAFKA_LOG"
  fi
  kafka_scram_user
  log "kafka: up (pid $(pid_of kafka)) 127.0.0.1:$KAFKA_PORT; $KAFKA_LISTENERS_NOTE"
}

kafka_down() {
  if ! alive kafka "$KAFKA_PATTERN"; then
    rm -f "$RUN/kafka.pid"
    log "kafka: not running (nothing started by services.sh)"
    return 0
  fi
  log "kafka: stopping pid $(pid_of kafka)"
  stop_pid kafka "$KAFKA_PATTERN" 30
  log "kafka: down"
}

kafka_status() {
  if alive kafka "$KAFKA_PATTERN"; then
    if paused kafka; then
      printf '%-9s up (paused: pid %s is SIGSTOPped)  127.0.0.1:%s  (%s)\n' kafka "$(pid_of kafka)" "$KAFKA_PORT" "$KAFKA_LISTENERS_NOTE"
      return 0
    fi
    if port_open "$KAFKA_PORT"; then
      printf '%-9s up    pid %-8s 127.0.0.1:%s  (%s)\n' kafka "$(pid_of kafka)" "$KAFKA_PORT" "$KAFKA_LISTENERS_NOTE"
      return 0
    fi
    printf '%-9s down  (pid %s runs but 127.0.0.1:%s is closed; log %s)\n' kafka "$(pid_of kafka)" "$KAFKA_PORT" "$KAFKA_LOG"
    return 1
  fi
  printf '%-9s down  (log %s)\n' kafka "$KAFKA_LOG"
  return 1
}
