#!/usr/bin/env bash
# Makes throw-away TLS certificates for test servers on loopback, with openssl, in DIR: a CA
# (ca.crt, ca.key) and a server certificate for 127.0.0.1 it signed (server.crt, server.key),
# valid for two days. What openssl says is kept in DIR/openssl.log, and shown when it fails.
set -euo pipefail
cd "$1"
make_certs() {
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=jobrt-test-ca -keyout ca.key -out ca.crt &&
    openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout server.key -out server.csr &&
    printf 'subjectAltName=IP:127.0.0.1\n' >server.ext &&
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile server.ext \
      -out server.crt
}
make_certs >openssl.log 2>&1 || { cat openssl.log >&2; exit 1; }
