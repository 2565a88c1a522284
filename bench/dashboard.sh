#!/usr/bin/env bash
# The dashboard's pages against the "each page in under 300 ms (p95, in the browser)" goal: every
# page timed in headless Chromium on a small queue (1,000 jobs, 100 dead letters: the baseline),
# then on a queue of N jobs over N/10 groups with 10,000 dead letters, one throw-away server for
# both. Prints p50/p95 per page and the ratio of the big queue's p95 to the small one's.
# Usage: bench/dashboard.sh [N=1000000] [ROUNDS=20] [BUILD=build/release]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-1000000}
rounds=${2:-20}
build=${BUILD:-$root/build/release}
if [ ! -x "$build/runtime/jobrt" ]; then
  "$root/scripts/setup.sh"
  "$root/scripts/build.sh" "$build" -DCMAKE_BUILD_TYPE=Release -DJOBRT_BUILD_TESTS=OFF >/dev/null
fi
[ -d "$root/tests/dashboard/node_modules/playwright-core" ] || (cd "$root/tests/dashboard" && npm ci --no-audit --no-fund)
jobrt=$build/runtime/jobrt
read -r port dir < <("$root/scripts/redis.sh")
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; "$root/scripts/redis.sh" stop "$dir"' EXIT
url=redis://127.0.0.1:$port

board() {  # starts a dashboard of queue $1; sets $base
  "$jobrt" dashboard --redis "$url" --queue "$1" --listen 127.0.0.1:0 --read-only >"$dir/board-$1.out" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    base=$(grep -o 'http://127.0.0.1:[0-9]*/' "$dir/board-$1.out" || true)
    [ -n "$base" ] && return
    sleep 0.05
  done
  echo "the dashboard did not start:"; cat "$dir/board-$1.out"; exit 1
}

# A queue of $2 jobs over $2/10 groups (that no worker runs) and $3 dead letters (failed by a
# worker, which is then stopped).
fill() {
  local queue=$1 jobs=$2 dead=$3 worker
  "$jobrt" enqueue --redis "$url" --queue "$queue" --type sleep --payload '{"ms":0,"fail":true}' --max-attempts 1 \
    --count "$dead" --groups "$((dead / 10))" >/dev/null
  "$jobrt" worker --redis "$url" --queue "$queue" --plugin "$build/handlers/jobrt_sleep.so" --concurrency 200 \
    --log-level warn >"$dir/worker.out" 2>&1 &
  worker=$!
  pids+=($worker)
  until "$jobrt" stats --redis "$url" --queue "$queue" --json | grep -q "\"dead\":$dead"; do sleep 0.2; done
  kill "$worker"; wait "$worker" || true
  "$jobrt" enqueue --redis "$url" --queue "$queue" --type noop --count "$jobs" --groups "$((jobs / 10))" >/dev/null
  # One kept job, behind the others of its group (the job page finds it by its id alone).
  "$jobrt" enqueue --redis "$url" --queue "$queue" --type noop --group g12 --id kept-probe --keep 3600000 >/dev/null
  DEAD_ID=$("$jobrt" dlq list --redis "$url" --queue "$queue" --json | sed -n '1s/.*"id":"\([^"]*\)".*/\1/p')
  export DEAD_ID
}

# The baseline: a small queue of the same shape (1,000 jobs, 100 dead letters).
fill small 1000 100
board small
node "$root/bench/dashboard.mjs" "$base" small "$rounds" small >"$dir/small.json"

# The big queue: N jobs over N/10 groups and 10,000 dead letters.
start=$(date +%s%N)
fill big "$n" 10000
awk -v ns=$(($(date +%s%N) - start)) 'BEGIN { printf "filled in %.1f s\n", ns / 1e9 }'
board big
node "$root/bench/dashboard.mjs" "$base" big "$rounds" big >"$dir/big.json"
echo "memory used: $(redis-cli -p "$port" info memory | awk -F: '/^used_memory_human/ {print $2}' | tr -d '\r')"

node -e '
const fs = require("fs");
const read = (f) => fs.readFileSync(f, "utf8").trim().split("\n").map(JSON.parse);
const small = read(process.argv[1]), big = read(process.argv[2]);
console.log("page                     small p50/p95 ms    big p50/p95 ms   big/small p95");
for (const b of big) {
  const s = small.find((x) => x.page === b.page);
  console.log(b.page.padEnd(24), (s.p50_ms + " / " + s.p95_ms).padStart(16), (b.p50_ms + " / " + b.p95_ms).padStart(18),
    (b.p95_ms / s.p95_ms).toFixed(2).padStart(12) + "x");
}
console.log("slowest big-queue p95:", Math.max(...big.map((b) => b.p95_ms)), "ms (goal: under 300)");
' "$dir/small.json" "$dir/big.json"
