#!/usr/bin/env bash
# The connection benchmark against redis-benchmark, in one run on one throw-away server.
# Usage: bench/connection.sh [N=1000000] [C=64] [RUNS=3]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-1000000}; c=${2:-64}; runs=${3:-3}
"$root/scripts/setup.sh"
"$root/scripts/build.sh" "$root/build/release" -DCMAKE_BUILD_TYPE=Release -DJOBRT_BUILD_TESTS=OFF >/dev/null
read -r port dir < <("$root/scripts/redis.sh")
trap '"$root/scripts/redis.sh" stop "$dir"' EXIT
# The server on core 0 and every client on core 1, so runs do not differ by where the scheduler
# puts them.
taskset -cp 0 "$(cat "$dir/redis.pid")" >/dev/null
rb() { taskset -c 1 redis-benchmark -p "$port" -t set -n "$n" -q "$@" | tr '\r' '\n' | awk '/SET:/ {print $2}' | tail -1; }
for run in $(seq "$runs"); do
  ours=$(taskset -c 1 "$root/build/release/bench/jobrt_bench_connection" "redis://127.0.0.1:$port" "$n" "$c" | sed 's/.*ops_per_sec=\([0-9]*\).*/\1/')
  pipelined=$(rb -c 1 -P "$c")
  parallel=$(rb -c 50 -P 1)
  awk -v r="$run" -v o="$ours" -v p="$pipelined" -v q="$parallel" -v c="$c" 'BEGIN {
    printf "run %d: jobrt C=%d %.0f/s | redis-benchmark -c 1 -P %d %.0f/s (ratio %.2f) | -c 50 -P 1 %.0f/s (ratio %.2f)\n",
      r, c, o, c, p, o / p, q, o / q }'
done
