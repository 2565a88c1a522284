#!/usr/bin/env bash
# One queue spread over a Redis Cluster, against one server: the same workload (N no-op jobs
# over 1,000 groups, and ungrouped; enqueued, then run by one worker of concurrency 100) on a
# plain redis-server with 1 shard and on a local 3-primary cluster with SHARDS shards, taking
# turns in one run, and with SHARDS shards on a cluster of one node (all its slots on one
# server). None has replicas. Each server's CPU comes from its own INFO; per workload the
# script prints the runs and how they compare:
#   cpu_ratio       Redis CPU per job, summed over the cluster's nodes, / the one server's
#   alone_ratio     the same on the one-node cluster: what the shards cost without the three
#                   nodes sharing one core (cpu_ratio / alone_ratio is what sharing it costs)
#   busiest_share   the busiest node's part of the cluster's Redis CPU
#   capacity_ratio  (jobs / the busiest node's CPU seconds) on the cluster / (jobs / CPU
#                   seconds) on the one server: the throughput each could reach with one core a
#                   node, as the busiest node saturates first
# Usage: bench/cluster.sh [N=100000] [RUNS=3]   (SHARDS=48; BUILD=0 to use build/release as is)
# About 3 minutes a run on this 2-core VM. Servers are pinned to core 0, the client to core 1.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
n=${1:-100000} runs=${2:-3} shards=${SHARDS:-48}
build_dir=${BUILD_DIR:-$root/build/release}
if [ "${BUILD:-1}" = 1 ]; then
  scripts/setup.sh
  scripts/build.sh "$build_dir" -DCMAKE_BUILD_TYPE=Release -DJOBRT_BUILD_TESTS=OFF >/dev/null
fi
bin=$build_dir/bench/jobrt_bench_jobs
[ -x "$bin" ] || { echo "bench/cluster.sh: $bin is not built" >&2; exit 1; }

read -r port dir < <(scripts/redis.sh)
read -r cport cdir < <(REPLICAS=0 scripts/cluster.sh start)
read -r aport adir < <(PRIMARIES=1 REPLICAS=0 scripts/cluster.sh start)
trap 'scripts/redis.sh stop "$dir"; scripts/cluster.sh stop "$cdir"; scripts/cluster.sh stop "$adir"' EXIT
for pidfile in "$dir/redis.pid" "$cdir"/*/redis.pid "$adir"/*/redis.pid; do
  taskset -cp 0 "$(cat "$pidfile")" >/dev/null
done
one=redis://127.0.0.1:$port
alone=redis://127.0.0.1:$aport
nodes=()
for i in 0 1 2; do nodes+=("redis://127.0.0.1:$((cport + i))"); done

field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p"; }
for run in $(seq "$runs"); do
  for groups in 1000 0; do
    a=$(taskset -c 1 "$bin" "$one" scale "$n" 100 "$groups" 1 "$one")
    m=$(taskset -c 1 "$bin" "$alone" scale "$n" 100 "$groups" "$shards" "$alone")
    b=$(taskset -c 1 "$bin" "${nodes[0]}" scale "$n" 100 "$groups" "$shards" "${nodes[@]}")
    echo "run=$run $a"
    echo "run=$run alone $m"
    echo "run=$run $b"
    awk -v run="$run" -v g="$groups" -v s="$shards" \
      -v c1="$(field "$a" redis_cpu_us_per_job)" -v c2="$(field "$b" redis_cpu_us_per_job)" \
      -v cm="$(field "$m" redis_cpu_us_per_job)" -v share="$(field "$b" busiest_share)" \
      -v k1="$(field "$a" jobs_per_busiest_cpu_s)" -v k2="$(field "$b" jobs_per_busiest_cpu_s)" \
      'BEGIN { printf "run=%s compare groups=%s shards=%s cpu_ratio=%.2f alone_ratio=%.2f busiest_share=%.3f capacity_ratio=%.2f\n",
                      run, g, s, c2 / c1, cm / c1, share, k2 / k1 }'
  done
done
