#!/usr/bin/env bash
# The distributed lock against a sleep-and-retry lock (100 ms), every scenario in one run on one
# throw-away server, RUNS runs interleaved. Prints key=value lines and, per run, the ratios.
# Usage: bench/lock.sh [SECONDS=3] [RUNS=3]      (JOBS=1 to build on one core)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-3}; runs=${2:-3}
"$root/scripts/setup.sh"
cmake -S "$root" -B "$root/build/release" -DCMAKE_BUILD_TYPE=Release -DJOBRT_BUILD_TESTS=OFF >/dev/null
cmake --build "$root/build/release" -j "${JOBS:-$(nproc)}" --target jobrt_bench_lock >/dev/null
read -r port dir < <("$root/scripts/redis.sh")
trap '"$root/scripts/redis.sh" stop "$dir"' EXIT
taskset -cp 0 "$(cat "$dir/redis.pid")" >/dev/null  # server on core 0, clients on core 1
url="redis://127.0.0.1:$port"
bench() { taskset -c 1 "$root/build/release/bench/jobrt_bench_lock" "$url" "$@"; }
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }

for run in $(seq "$runs"); do
  echo "run $run"
  line=$(bench rtt 5000); echo "$line"
  rtt=$(echo "$line" | field p50_us)
  # SERVICES=1: every waiter in one process; 4: waiters spread over 4 services (as 4 processes).
  for scenario in "1 50 1" "100 50 1" "1 50 4" "100 50 4"; do
    set -- $scenario
    base=$(bench sleep-retry "$1" "$2" $((secs + 2)) "$3"); echo "$base"
    base_tp=$(echo "$base" | field pairs_per_sec)
    for kind in jobrt jobrt-fifo; do
      line=$(bench "$kind" "$1" "$2" "$secs" "$3"); echo "$line"
      echo "$line" | awk -v rtt="$rtt" -v b="$base_tp" '{
        for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        printf "  ratio %s locks=%s services=%s: throughput %.0fx sleep-retry, hand-off p50 %.2fx rtt p50\n",
          v["mode"], v["locks"], v["services"], v["pairs_per_sec"] / b, v["handoff_p50_us"] / rtt }'
    done
  done
done
