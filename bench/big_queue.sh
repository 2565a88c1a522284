#!/usr/bin/env bash
# A big queue against the "no call holds the server up" goal, on one throw-away server that logs
# every command of 20 ms or more: N jobs over N/10 groups enqueued with jobrt enqueue, then
# jobrt check (twice), stats, dlq list and group show, while a probe times another client's PING
# every 10 ms. Prints each step's time, the slowest PING against the same probe on the idle
# server first, and the SLOWLOG.
# Usage: bench/big_queue.sh [N=1000000] [BUILD=build/release]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-1000000}
build=${BUILD:-$root/build/release}
if [ ! -x "$build/runtime/jobrt" ]; then
  "$root/scripts/setup.sh"
  "$root/scripts/build.sh" "$build" -DCMAKE_BUILD_TYPE=Release -DJOBRT_BUILD_TESTS=OFF >/dev/null
fi
jobrt=$build/runtime/jobrt
read -r port dir < <("$root/scripts/redis.sh")
trap '"$root/scripts/redis.sh" stop "$dir"; [ -n "${probe:-}" ] && kill "$probe" 2>/dev/null || true' EXIT
url=redis://127.0.0.1:$port
redis-cli -p "$port" config set slowlog-log-slower-than 20000 >/dev/null
redis-cli -p "$port" slowlog reset >/dev/null

# The probe: another client's view of the server, one PING every 10 ms, its slowest answer kept
# in FILE. Its baseline is the same probe for 3 s on the idle server, first.
probe() {
  local file=$1 slowest=0 start took
  while :; do
    start=$(date +%s%N)
    redis-cli -p "$port" ping >/dev/null 2>&1 || break
    took=$((($(date +%s%N) - start) / 1000))
    [ "$took" -gt "$slowest" ] && { slowest=$took; echo "$slowest" >"$file"; }
    sleep 0.01
  done
}
probe "$dir/idle-ping-us" &
probe=$!
sleep 3
kill "$probe"
probe "$dir/slowest-ping-us" &
probe=$!

step() {
  local name=$1; shift
  local start; start=$(date +%s%N)
  "$@" >"$dir/step.out" 2>&1 || { echo "$name failed:"; cat "$dir/step.out"; exit 1; }
  awk -v name="$name" -v ns=$(($(date +%s%N) - start)) 'BEGIN { printf "%-34s %8.2f s\n", name, ns / 1e9 }'
}
step "enqueue $n over $((n / 10)) groups" "$jobrt" enqueue --redis "$url" --queue big --type t --payload '{}' \
  --count "$n" --groups "$((n / 10))"
step "check" "$jobrt" check --redis "$url" --queue big
step "check --repair" "$jobrt" check --redis "$url" --queue big --repair
step "stats" "$jobrt" stats --redis "$url" --queue big
step "dlq list" "$jobrt" dlq list --redis "$url" --queue big
step "group show" "$jobrt" group show --redis "$url" --queue big
grep -o '([0-9]* calls to the server)' <("$jobrt" check --redis "$url" --queue big) | sed 's/^/check: /'
echo "memory used: $(redis-cli -p "$port" info memory | awk -F: '/^used_memory_human/ {print $2}' | tr -d '\r')"
kill "$probe" 2>/dev/null || true
idle=$(cat "$dir/idle-ping-us"); busy=$(cat "$dir/slowest-ping-us")
awk -v i="$idle" -v b="$busy" 'BEGIN { printf "slowest PING of another client: %d us meanwhile, %d us on the idle server (%.2fx)\n", b, i, b / i }'
entries=$(redis-cli -p "$port" slowlog len)
echo "SLOWLOG entries at 20 ms: $entries"
redis-cli -p "$port" slowlog get 5 | head -40
