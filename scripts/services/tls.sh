# shellcheck shell=bash
# The local services' TLS, made as production's is: a CA of our own signs the certificates that
# Postgres (ssl = on) and Kafka's SSL and SASL_SSL listeners present; a client trusts it with
# NODE_EXTRA_CA_CERTS=.cache/tls/ca.pem and checks the host name (verify-full). Kept in .cache/tls,
# made again only when a file is missing or a certificate expires within a week.
#
#   ca.pem                         the CA clients trust
#   server.pem, server.key         localhost and 127.0.0.1, signed by the CA (Postgres, Kafka)
#   kafka-keystore.pem             server.key + server.pem + ca.pem, Kafka's PEM keystore
#   wrong-host.pem, .key           signed by the CA for wrong-host.invalid only (a refusal test)
#   unknown-ca.pem                 a second CA no client trusts
#   unknown-ca-server.pem, .key    localhost and 127.0.0.1, signed by that second CA (a refusal test)

TLS_DIR="$CACHE/tls"
TLS_FILES=(ca.pem ca.key server.pem server.key kafka-keystore.pem wrong-host.pem wrong-host.key unknown-ca.pem unknown-ca.key unknown-ca-server.pem unknown-ca-server.key)

# tls_sign NAME CA SAN: an EC P-256 key NAME.key and a certificate NAME.pem for SAN, signed by CA.
tls_sign() {
  local name="$1" ca="$2" san="$3"
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$name.key" &&
    openssl req -new -key "$name.key" -subj "/CN=$(sed -E "s/^(DNS|IP):([^,]*).*/\2/" <<<"$san")" -out "$name.csr" &&
    printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' \
      "$san" >"$name.ext" &&
    openssl x509 -req -in "$name.csr" -CA "$ca.pem" -CAkey "$ca.key" -CAcreateserial -days 825 -sha256 \
      -extfile "$name.ext" -out "$name.pem" &&
    rm -f "$name.csr" "$name.ext"
}

tls_ca() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$1.key" -out "$1.pem" -days 3650 \
    -subj "/CN=$2" -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
}

tls_fresh() {
  local f
  for f in "${TLS_FILES[@]}"; do [[ -s "$TLS_DIR/$f" ]] || return 1; done
  for f in ca server wrong-host unknown-ca unknown-ca-server; do
    openssl x509 -checkend 604800 -noout -in "$TLS_DIR/$f.pem" >/dev/null 2>&1 || return 1
  done
}

# tls_certs: the files above, made when missing or about to expire (~0.2 s).
tls_certs() {
  tls_fresh && return 0
  command -v openssl >/dev/null 2>&1 || apt_install openssl ||
    fail tls "openssl is needed to make the local services' certificates (apt-get install openssl)" ""
  log "tls: making a CA and certificates in $TLS_DIR"
  local tmp="$TLS_DIR.tmp"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  if ! (cd "$tmp" &&
    tls_ca ca "outbox-relay local test CA" &&
    tls_sign server ca "DNS:localhost,IP:127.0.0.1" &&
    tls_sign wrong-host ca "DNS:wrong-host.invalid" &&
    tls_ca unknown-ca "an unknown CA" &&
    tls_sign unknown-ca-server unknown-ca "DNS:localhost,IP:127.0.0.1" &&
    cat server.key server.pem ca.pem >kafka-keystore.pem) >"$CACHE/tls.log" 2>&1; then
    fail tls "openssl could not make the certificates" "$CACHE/tls.log"
  fi
  chmod 644 "$tmp"/*.pem
  chmod 600 "$tmp"/*.key "$tmp/kafka-keystore.pem"
  rm -rf "$TLS_DIR"
  mv "$tmp" "$TLS_DIR"
}
