#!/usr/bin/env bash
# jobrt over TLS against plain TCP, on one redis-server that serves both (a plain port and a
# TLS port, with a CA and a server certificate from scripts/test-certs.sh), taking turns in one run:
#   throughput  N no-op jobs over 1,000 groups, enqueued then run by one worker of concurrency
#               100 (jobrt_bench_jobs ... throughput N 100 1000): jobs a second, TLS / plain
#   pickup      idle pickup p50 and p99 of 300 jobs, one at a time (... pickup 300 0)
# Usage: bench/tls.sh [N=100000] [RUNS=3]   (BUILD=0 to use build/release as is)
# Server on core 0, client on core 1.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
n=${1:-100000} runs=${2:-3}
build_dir=${BUILD_DIR:-$root/build/release}
if [ "${BUILD:-1}" = 1 ]; then
  scripts/setup.sh
  scripts/build.sh "$build_dir" -DCMAKE_BUILD_TYPE=Release -DJOBRT_BUILD_TESTS=OFF >/dev/null
fi
bin=$build_dir/bench/jobrt_bench_jobs
[ -x "$bin" ] || { echo "bench/tls.sh: $bin is not built" >&2; exit 1; }

read -r port dir tls_port < <(TLS=1 scripts/redis.sh)  # (a plain port and a TLS one)
trap 'scripts/redis.sh stop "$dir"' EXIT
taskset -cp 0 "$(cat "$dir/redis.pid")" >/dev/null
plain=redis://127.0.0.1:$port
tls="rediss://127.0.0.1:$tls_port/0?ca=$dir/ca.crt"

field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p"; }
for run in $(seq "$runs"); do
  a=$(taskset -c 1 "$bin" "$plain" throughput "$n" 100 1000)
  b=$(taskset -c 1 "$bin" "$tls" throughput "$n" 100 1000)
  c=$(taskset -c 1 "$bin" "$plain" pickup 300 0)
  d=$(taskset -c 1 "$bin" "$tls" pickup 300 0)
  echo "run=$run plain $a"
  echo "run=$run tls $b"
  echo "run=$run plain $c"
  echo "run=$run tls $d"
  awk -v run="$run" -v j1="$(field "$a" jobs_per_sec)" -v j2="$(field "$b" jobs_per_sec)" \
    -v p1="$(field "$c" p50_us)" -v p2="$(field "$d" p50_us)" -v q1="$(field "$c" p99_us)" -v q2="$(field "$d" p99_us)" \
    'BEGIN { printf "run=%s compare throughput_ratio=%.2f pickup_p50_ratio=%.2f pickup_p99_ratio=%.2f\n",
                    run, j2 / j1, p2 / p1, q2 / q1 }'
done
