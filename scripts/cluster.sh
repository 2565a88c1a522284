#!/usr/bin/env bash
# A throw-away Redis Cluster on loopback: 3 primaries and 3 replicas, plain redis-server processes
# on six consecutive free ports, no persistence, in a temp dir.
#   scripts/cluster.sh start        prints "PORT DIR": the first node's port (the nodes use
#                                   PORT to PORT+5, their cluster bus PORT+10000 to PORT+10005)
#                                   REPLICAS=0 in the environment: 3 primaries only (PORT to PORT+2);
#                                   PRIMARIES=1 REPLICAS=0: one node serving every slot
#   scripts/cluster.sh stop DIR     stops every node of it and removes DIR
#   scripts/cluster.sh restart DIR PORT   starts that node again (after a crash: it rejoins,
#                                   as a replica when its replica took over meanwhile)
set -euo pipefail
replicas=${REPLICAS:-1}
primaries=${PRIMARIES:-3}
case "$primaries/$replicas" in
  3/*|1/0) ;;
  *) echo "scripts/cluster.sh: PRIMARIES is 3, or 1 with REPLICAS=0" >&2; exit 2 ;;
esac
nodes=$((primaries * (1 + replicas)))

start_node() {  # starts the node of port $1 in $dir/$1
  redis-server --port "$1" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir/$1" \
    --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
    --repl-diskless-sync-delay 0 \
    --daemonize yes --pidfile "$dir/$1/redis.pid" --logfile "$dir/$1/redis.log" >/dev/null
}

if [ "${1:-}" = restart ]; then
  dir=$2
  start_node "$3"
  for _ in $(seq 100); do redis-cli -p "$3" ping >/dev/null 2>&1 && exit 0; sleep 0.05; done
  echo "node $3 did not come back (see $dir/$3/redis.log)" >&2
  exit 1
fi

if [ "${1:-}" = stop ]; then
  dir=$2
  for pidfile in "$dir"/*/redis.pid; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  for pidfile in "$dir"/*/redis.pid; do
    for _ in $(seq 50); do [ -e "$pidfile" ] || break; sleep 0.1; done
  done
  rm -rf "$dir"
  exit 0
fi
if [ "${1:-}" != start ]; then
  echo "usage: scripts/cluster.sh start | stop DIR | restart DIR PORT" >&2
  exit 2
fi

free() {  # whether PORT and its bus port are free on loopback
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && ! (exec 3<>"/dev/tcp/127.0.0.1/$(($1 + 10000))") 2>/dev/null
}

dir=$(mktemp -d /tmp/jobrt-cluster.XXXXXX)
for _ in $(seq 20); do
  # Below Linux's ephemeral ports (32768 and up), bus ports included: no client socket, and no
  # test server on a port the kernel gave it, can take one of them.
  base=$((20000 + RANDOM % 2700))
  ok=1
  for i in $(seq 0 $((nodes - 1))); do free $((base + i)) || ok=0; done
  [ $ok = 1 ] || continue
  addresses=()
  for i in $(seq 0 $((nodes - 1))); do
    port=$((base + i))
    mkdir -p "$dir/$port"
    start_node "$port" || ok=0
    addresses+=("127.0.0.1:$port")
  done
  for i in $(seq 0 $((nodes - 1))); do
    for _ in $(seq 100); do redis-cli -p $((base + i)) ping >/dev/null 2>&1 && break; sleep 0.05; done
  done
  create() {
    if [ "$primaries" = 1 ]; then
      redis-cli -p "$base" cluster addslotsrange 0 16383 | grep -q OK
    else
      redis-cli --cluster create "${addresses[@]}" --cluster-replicas "$replicas" --cluster-yes
    fi
  }
  if [ $ok = 1 ] && create >"$dir/create.log" 2>&1; then
    # Up when every node says so (the others learn the slots through the bus), every replica has
    # its primary's data (a replica that never synced cannot take over from it), and every node
    # knows which nodes are replicas.
    for _ in $(seq 200); do
      up=0
      for i in $(seq 0 $((nodes - 1))); do
        redis-cli -p $((base + i)) cluster info 2>/dev/null | grep -q '^cluster_state:ok' || continue
        redis-cli -p $((base + i)) info replication 2>/dev/null | tr -d '\r' |
          grep -q -e '^role:master' -e '^master_link_status:up' || continue
        # ...and it knows every replica for one (gossip spreads the roles).
        [ "$(redis-cli -p $((base + i)) cluster nodes 2>/dev/null | awk '$3 ~ /slave/' | wc -l)" = $((primaries * replicas)) ] &&
          up=$((up + 1))
      done
      if [ $up = $nodes ]; then echo "$base $dir"; exit 0; fi
      sleep 0.05
    done
  fi
  # Not up here (a port taken meanwhile): stop what started and try other ports.
  "$0" stop "$dir"
  dir=$(mktemp -d /tmp/jobrt-cluster.XXXXXX)
done
echo "could not start a cluster (see $dir)" >&2
exit 1
