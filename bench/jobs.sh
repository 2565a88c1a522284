#!/usr/bin/env bash
# The job runtime on Redis, every scenario in one run on one throw-away server, 3 runs each.
# Usage: bench/jobs.sh [N=100000] [RUNS=3]   (prints key=value lines; docs/BENCHMARKS.md has them)
# About 9 minutes a run: the pickup 100 ms apart alone takes 400 s.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-100000}; runs=${2:-3}
"$root/scripts/setup.sh"
"$root/scripts/build.sh" "$root/build/release" -DCMAKE_BUILD_TYPE=Release -DJOBRT_BUILD_TESTS=OFF >/dev/null
read -r port dir < <("$root/scripts/redis.sh")
trap '"$root/scripts/redis.sh" stop "$dir"' EXIT
taskset -cp 0 "$(cat "$dir/redis.pid")" >/dev/null  # server on core 0, clients on core 1
url="redis://127.0.0.1:$port"
bench() { taskset -c 1 "$root/build/release/bench/jobrt_bench_jobs" "$url" "$@"; }

# The yardstick: one script call of 3 commands (LPOP, SET NX PX, RPUSH), pipelined 16 deep.
sha=$(redis-cli -p "$port" SCRIPT LOAD "local v = redis.call('LPOP', KEYS[1]) redis.call('SET', KEYS[2], 'x', 'NX', 'PX', 1000) if v then redis.call('RPUSH', KEYS[1], v) end return 1")
redis-cli -p "$port" RPUSH yard:list a b c >/dev/null
for run in $(seq "$runs"); do
  echo "run $run"
  calls=$(taskset -c 1 redis-benchmark -p "$port" -c 1 -P 16 -n 200000 -q EVALSHA "$sha" 2 yard:list yard:lock |
          tr '\r' '\n' | awk '/requests per second/ {for (i = 1; i <= NF; i++) if ($i == "requests") v = $(i - 1)} END {print v}')
  echo "yardstick evalsha_calls_per_sec=$calls"
  for groups in 0 1 1000 100000; do bench throughput "$n" 100 "$groups"; done
  # Idle pickup, jobs 1 ms apart (as the Node peers of bench/run can send them) and 100 ms
  # apart (a worker idle for a while: there the bare wake-up is what issue 3 names, 0.5 ms).
  for gap in 1000 100000; do
    bench pickup 1000 0 "$gap" | sed "s/^pickup /pickup gap_us=$gap /"
    bench pickup 1000 1 "$gap" | sed "s/^pickup /pickup gap_us=$gap /"
  done
  bench depth 1000000
done
