#!/usr/bin/env bash
# Starts a throw-away rabbitmq-server on loopback: a node of its own name, free ports, data, logs
# and Erlang cookie in a temp dir. Prints "PORT DIR"; stop it with: scripts/rabbitmq.sh stop DIR
# scripts/rabbitmq.sh ctl DIR ARGS... runs rabbitmqctl ARGS at that node (close_all_connections).
# TLS=1: it also listens with TLS (amqps://), with a certificate for 127.0.0.1 that DIR/tls/ca.crt
# signed (scripts/test-certs.sh), and prints "PORT DIR TLS_PORT".
set -euo pipefail
# Debian's /usr/sbin wrappers switch to the rabbitmq user and its home; these run as the caller.
bin=/usr/lib/rabbitmq/bin
node_env() {  # the environment that names the node in $1
  local dir=$1
  export HOME=$dir RABBITMQ_NODENAME=$(cat "$dir/node") RABBITMQ_MNESIA_BASE=$dir/mnesia RABBITMQ_LOG_BASE=$dir/log \
    RABBITMQ_PID_FILE=$dir/rabbit.pid RABBITMQ_ENABLED_PLUGINS_FILE=$dir/enabled_plugins \
    RABBITMQ_CONFIG_FILE=$dir/rabbitmq RABBITMQ_ADVANCED_CONFIG_FILE=$dir/advanced.config \
    RABBITMQ_CONF_ENV_FILE=$dir/rabbitmq-env.conf
}
case "${1:-start}" in
stop)
  dir=$2
  if [ -f "$dir/node" ]; then
    node_env "$dir"
    "$bin/rabbitmqctl" -q stop "$dir/rabbit.pid" >/dev/null 2>&1 || true
  fi
  rm -rf "$dir"
  exit 0
  ;;
ctl)
  dir=$2
  shift 2
  node_env "$dir"
  exec "$bin/rabbitmqctl" -q "$@"
  ;;
esac
dir=$(mktemp -d /tmp/jobrt-rabbitmq.XXXXXX)
chmod 755 "$dir"
# The cookie the server and rabbitmqctl share, made before either can race to make it.
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$dir/.erlang.cookie"
chmod 400 "$dir/.erlang.cookie"
echo "jobrt$(basename "$dir" | tr -cd 'a-zA-Z0-9')@localhost" > "$dir/node"
if [ "${TLS:-}" = 1 ]; then
  mkdir "$dir/tls"
  "$(dirname "$0")/test-certs.sh" "$dir/tls" || { rm -rf "$dir"; exit 1; }
  chmod 644 "$dir/tls"/*
fi
# The ports below the kernel's ephemeral range (32768 and up by default), where an outgoing
# connection may hold a port that no listener shows.
for _ in $(seq 5); do
  port=$((10000 + RANDOM % 20000))
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && continue  # taken
  (exec 3<>"/dev/tcp/127.0.0.1/$((port + 1))") 2>/dev/null && continue  # its distribution port
  printf 'listeners.tcp.1 = 127.0.0.1:%s\nloopback_users = none\n' "$port" > "$dir/rabbitmq.conf"
  tls_port=
  if [ -d "$dir/tls" ]; then
    tls_port=$((port + 2))
    (exec 3<>"/dev/tcp/127.0.0.1/$tls_port") 2>/dev/null && continue
    printf '%s\n' "listeners.ssl.1 = 127.0.0.1:$tls_port" "ssl_options.cacertfile = $dir/tls/ca.crt" \
      "ssl_options.certfile = $dir/tls/server.crt" "ssl_options.keyfile = $dir/tls/server.key" \
      "ssl_options.verify = verify_none" "ssl_options.fail_if_no_peer_cert = false" >> "$dir/rabbitmq.conf"
  fi
  printf '[].\n' > "$dir/enabled_plugins"
  : > "$dir/rabbitmq-env.conf"
  node_env "$dir"
  export RABBITMQ_DIST_PORT=$((port + 1)) ERL_EPMD_ADDRESS=127.0.0.1
  mkdir -p "$dir/mnesia" "$dir/log"
  "$bin/rabbitmq-server" > "$dir/server.out" 2>&1 &
  server=$!
  for _ in $(seq 60); do  # while the server lives (each wait takes a second or two)
    kill -0 "$server" 2>/dev/null || break
    grep -q "Kernel pid terminated" "$dir/server.out" && break
    if "$bin/rabbitmqctl" -q wait --timeout 1 "$dir/rabbit.pid" >/dev/null 2>&1; then
      echo "$port $dir${tls_port:+ $tls_port}"
      exit 0
    fi
  done
  "$bin/rabbitmqctl" -q stop "$dir/rabbit.pid" >/dev/null 2>&1 || kill "$server" 2>/dev/null || true
  kill "$server" 2>/dev/null || true
  grep -qE "eaddrinuse|already_used" "$dir/server.out" "$dir/log"/*.log 2>/dev/null || break  # else: other ports
done
echo "could not start rabbitmq-server:" >&2
cat "$dir/server.out" >&2 || true
kill "$server" 2>/dev/null || true
rm -rf "$dir"
exit 1
