#!/usr/bin/env bash
# Starts a throw-away redis-server on loopback: free port, temp dir, no persistence.
# Prints "PORT DIR"; stop it with: scripts/redis.sh stop DIR
# TLS=1: it also listens with TLS, with a certificate for 127.0.0.1 that DIR/ca.crt signed
# (scripts/test-certs.sh), and prints "PORT DIR TLS_PORT".
set -euo pipefail
if [ "${1:-}" = stop ]; then
  dir=$2
  [ -f "$dir/redis.pid" ] && kill "$(cat "$dir/redis.pid")" 2>/dev/null || true
  for _ in $(seq 50); do [ -e "$dir/redis.pid" ] || break; sleep 0.1; done
  rm -rf "$dir"
  exit 0
fi
dir=$(mktemp -d /tmp/jobrt-redis.XXXXXX)
tls=()
if [ "${TLS:-}" = 1 ]; then
  "$(dirname "$0")/test-certs.sh" "$dir"
  tls=(--tls-cert-file "$dir/server.crt" --tls-key-file "$dir/server.key" --tls-ca-cert-file "$dir/ca.crt"
    --tls-auth-clients no)
fi
for _ in $(seq 20); do
  port=$((20000 + RANDOM % 40000))
  redis-cli -p "$port" ping >/dev/null 2>&1 && continue  # taken
  tls_port=$((20000 + RANDOM % 40000))
  [ ${#tls[@]} -gt 0 ] && { [ "$tls_port" = "$port" ] || redis-cli -p "$tls_port" ping >/dev/null 2>&1; } && continue
  if redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
      --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" \
      ${tls[@]+"${tls[@]}"} ${tls[@]+--tls-port "$tls_port"} >/dev/null; then
    for _ in $(seq 100); do
      if redis-cli -p "$port" ping >/dev/null 2>&1; then
        if [ ${#tls[@]} -gt 0 ]; then echo "$port $dir $tls_port"; else echo "$port $dir"; fi
        exit 0
      fi
      sleep 0.05
    done
  fi
done
echo "could not start redis-server (see $dir/redis.log)" >&2
exit 1
