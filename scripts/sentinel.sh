#!/usr/bin/env bash
# A throw-away Redis Sentinel deployment on loopback: a primary, its replica and three sentinels
# (redis-sentinel) that watch them as "jobrt", each in a directory of its own under one temp dir,
# no persistence. The sentinels take the primary for down after 1 s, with a quorum of 2.
#   scripts/sentinel.sh start            prints "PRIMARY REPLICA SENTINEL1 SENTINEL2 SENTINEL3 DIR" (ports)
#   scripts/sentinel.sh restart DIR PORT starts the server of PORT again (after a kill), empty, as a
#                                        replica of the primary the sentinels name now
#   scripts/sentinel.sh stop DIR
# PASSWORD=pw: the servers require it (the sentinels use it); SENTINEL_PASSWORD=pw: the sentinels
# require it too. TLS=1: servers and sentinels speak TLS only, with a certificate for 127.0.0.1
# that DIR/ca.crt signed (scripts/test-certs.sh).
set -euo pipefail
name=jobrt
password=${PASSWORD:-}
sentinel_password=${SENTINEL_PASSWORD:-}
tls_on() { [ -f "$dir/ca.crt" ]; }

taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# Ports below the range the system takes client ports from (a client's port cannot be listened
# on), above scripts/cluster.sh's.
read -r ephemeral_low ephemeral_high </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null ||
  { ephemeral_low=32768 ephemeral_high=60999; }
if [ $((ephemeral_low - 23000)) -ge 1000 ]; then
  low=23000 span=$((ephemeral_low - 23000))
elif [ $((65535 - ephemeral_high)) -ge 1000 ]; then
  low=$((ephemeral_high + 1)) span=$((65535 - ephemeral_high))
else
  echo "sentinel.sh: the system's client ports ($ephemeral_low-$ephemeral_high) leave no room" >&2
  exit 1
fi
free_port() {
  local p
  for _ in $(seq 50); do
    p=$((low + RANDOM % span))
    taken "$p" || grep -qx "$p" "$dir/ports" 2>/dev/null || { echo "$p" >>"$dir/ports"; echo "$p"; return; }
  done
  echo "sentinel.sh: no free port" >&2
  exit 1
}
cli() {  # PASSWORD PORT ARGS...: redis-cli, with the password and TLS when there are
  local tls=()
  tls_on && tls=(--tls --cacert "$dir/ca.crt")
  if [ -n "$1" ]; then
    REDISCLI_AUTH=$1 redis-cli "${tls[@]}" -p "$2" "${@:3}"
  else
    redis-cli "${tls[@]}" -p "$2" "${@:3}"
  fi
}
server_cli() { cli "$password" "$@"; }
sentinel_cli() { cli "$sentinel_password" "$@"; }
tls_options() {  # what redis-server and redis-sentinel need to speak TLS only
  tls_on && echo "tls-cert-file $dir/server.crt
tls-key-file $dir/server.key
tls-ca-cert-file $dir/ca.crt
tls-auth-clients no
tls-replication yes"
  return 0
}
wait_for() {  # DESCRIPTION COMMAND...: up to 20 s
  local what=$1
  shift
  for _ in $(seq 200); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "sentinel.sh: $what did not happen within 20 s (see $dir)" >&2
  return 1
}

start_server() {  # PORT [redis-server options...]
  local port=$1
  shift
  mkdir -p "$dir/$port"
  local auth=() listen=(--port "$port")
  [ -n "$password" ] && auth=(--requirepass "$password" --masterauth "$password")
  if tls_on; then
    listen=(--port 0 --tls-port "$port")
    while read -r key value; do listen+=("--$key" "$value"); done < <(tls_options)
  fi
  redis-server "${listen[@]}" --bind 127.0.0.1 --save "" --appendonly no --repl-diskless-sync-delay 0 \
    --dir "$dir/$port" --daemonize yes --pidfile "$dir/$port/redis.pid" --logfile "$dir/$port/redis.log" \
    "${auth[@]}" "$@" >/dev/null
  wait_for "redis-server on port $port answering" answers "$port"
}

answers() { server_cli "$1" ping | grep -q PONG; }
replica_synced() { server_cli "$1" INFO replication | grep -q "master_link_status:up"; }
sentinel_ready() {  # PORT: it knows the replica and the other two sentinels
  local out
  out=$(sentinel_cli "$1" SENTINEL MASTER "$name" | tr -d '\r' | paste - -)
  echo "$out" | grep -qP "^num-slaves\t1$" && echo "$out" | grep -qP "^num-other-sentinels\t2$"
}

stop_all() {
  local pids=()
  for pidfile in "$dir"/*/*.pid; do
    [ -f "$pidfile" ] && pids+=("$(cat "$pidfile")")
  done
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null && kill -CONT "$pid" 2>/dev/null || true; done  # (a stopped one too)
  for pid in "${pids[@]}"; do  # (a pid file may be a killed server's: its process is gone, or a zombie)
    for _ in $(seq 50); do
      [ -e "/proc/$pid" ] && [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] || break
      sleep 0.1
    done
  done
  rm -rf "$dir"
}

case "${1:-}" in
stop)
  dir=$2
  stop_all
  ;;
restart)
  dir=$2
  port=$3
  read -r -a sentinels <"$dir/sentinels"
  primary=()
  for s in "${sentinels[@]}"; do
    mapfile -t primary < <(sentinel_cli "$s" SENTINEL GET-MASTER-ADDR-BY-NAME "$name" 2>/dev/null | tr -d '\r')
    [ "${#primary[@]}" -eq 2 ] && break
  done
  [ "${#primary[@]}" -eq 2 ] || { echo "sentinel.sh: no sentinel names the primary" >&2; exit 1; }
  start_server "$port" --replicaof "${primary[0]}" "${primary[1]}"
  ;;
start)
  dir=$(mktemp -d /tmp/jobrt-sentinel.XXXXXX)
  started=0
  trap '[ "$started" = 1 ] || {
    echo "sentinel.sh: start failed; stopping what it started. Its logs end:" >&2
    tail -n 5 "$dir"/*/*.log >&2 2>/dev/null || true
    stop_all
  }' EXIT
  [ "${TLS:-}" = 1 ] && "$(dirname "$0")/test-certs.sh" "$dir"
  primary=$(free_port)
  replica=$(free_port)
  start_server "$primary"
  start_server "$replica" --replicaof 127.0.0.1 "$primary"
  wait_for "the replica's sync" replica_synced "$replica"
  # Each sentinel is told the others and the replica, so it need not wait to discover them.
  sentinels=()
  for _ in 1 2 3; do
    port=$(free_port)
    sentinels+=("$port")
  done
  ids=()
  for _ in 1 2 3; do ids+=("$(head -c 20 /dev/urandom | od -An -tx1 | tr -d ' \n')"); done
  for i in 0 1 2; do
    port=${sentinels[$i]}
    mkdir -p "$dir/$port"
    {
      if tls_on; then
        echo "port 0"
        echo "tls-port $port"
        tls_options
      else
        echo "port $port"
      fi
      echo "bind 127.0.0.1"
      echo "daemonize yes"
      echo "pidfile $dir/$port/sentinel.pid"
      echo "logfile $dir/$port/sentinel.log"
      echo "dir $dir/$port"
      echo "sentinel monitor $name 127.0.0.1 $primary 2"
      echo "sentinel down-after-milliseconds $name 1000"
      echo "sentinel failover-timeout $name 2000"
      echo "sentinel myid ${ids[$i]}"
      echo "sentinel known-replica $name 127.0.0.1 $replica"
      for j in 0 1 2; do
        [ "$j" = "$i" ] || echo "sentinel known-sentinel $name 127.0.0.1 ${sentinels[$j]} ${ids[$j]}"
      done
      [ -n "$password" ] && echo "sentinel auth-pass $name $password"
      [ -n "$sentinel_password" ] && echo "requirepass $sentinel_password"
    } >"$dir/$port/sentinel.conf"
    redis-sentinel "$dir/$port/sentinel.conf" >/dev/null
  done
  echo "${sentinels[*]}" >"$dir/sentinels"
  for s in "${sentinels[@]}"; do wait_for "sentinel $s seeing the replica and the other sentinels" sentinel_ready "$s"; done
  started=1
  echo "$primary $replica ${sentinels[*]} $dir"
  ;;
*)
  echo "usage: scripts/sentinel.sh start | restart DIR PORT | stop DIR" >&2
  exit 2
  ;;
esac
