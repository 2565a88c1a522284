#!/usr/bin/env bash
# Rate limits held to over a run. First a group's (job_spec::group_rate): for each setting
# below, groups with more jobs queued than their limit lets start, run by one worker of
# concurrency 100 for SECONDS (jobrt_bench_jobs ... rate GROUPS MAX WINDOW_MS SECONDS). Prints, per run, the starts
# each group made over what its limit allows (1.00: the limit reached exactly; the goal is within
# ±5%), the least and most of the groups, and the shortest time any max + 1 starts of a group
# took (by their handlers' start times: the window, when the limit holds).
#   settings: 100 groups at 10 a second, 10 groups at 100 a second, 1 group at 50 in 100 ms
# Then the queue's own limit (worker_options::rate_limit; jobrt_bench_jobs ... queue-rate WORKERS
# MAX WINDOW_MS SECONDS): workers sharing one limit, the starts over what it allows and the
# shortest time any max + 1 of them took.
#   settings: 2 workers at 100 a second, 4 workers at 1,000 a second, 2 workers at 50 in 100 ms
# Then fairness (jobrt_bench_jobs ... fairness SECONDS NOISY_CONC): 100 quiet groups' waits alone
# and beside a noisy group holding 90% of the backlog, the noisy group running up to 1, 4 or 16
# jobs at once (the worker has 16 slots); prints the p99s' ratio.
# Then weights (jobrt_bench_jobs ... weights SECONDS GROUPS N): 16 or 160 groups of each weight
# 1, 2 and 4, all backlogged, N = 1 or 4 of a group's jobs at once; prints each weight's starts
# per group over its weight, against weight 1's (1.00: in proportion; the goal is within ±10%).
# Then priorities (jobrt_bench_jobs ... priorities SECONDS [GROUPS PRIORITY]): urgent ungrouped
# jobs' waits alone and beside a backlog of jobs of priority 0, then urgent groups' beside a
# backlog over 1,000 groups, at priority 0 (the baseline) and 2; prints the p99s' ratio.
# Usage: bench/group_controls.sh [SECONDS=10] [RUNS=3]   (BUILD=0 to use build/release as is)
# Server on core 0, client on core 1.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
seconds=${1:-10} runs=${2:-3}
build_dir=${BUILD_DIR:-$root/build/release}
if [ "${BUILD:-1}" = 1 ]; then
  scripts/setup.sh
  scripts/build.sh "$build_dir" -DCMAKE_BUILD_TYPE=Release -DJOBRT_BUILD_TESTS=OFF >/dev/null
fi
bin=$build_dir/bench/jobrt_bench_jobs
[ -x "$bin" ] || { echo "bench/group_controls.sh: $bin is not built" >&2; exit 1; }

read -r port dir < <(scripts/redis.sh)
trap 'scripts/redis.sh stop "$dir"' EXIT
taskset -cp 0 "$(cat "$dir/redis.pid")" >/dev/null
url=redis://127.0.0.1:$port

for run in $(seq "$runs"); do
  for setting in "100 10 1000" "10 100 1000" "1 50 100"; do
    # shellcheck disable=SC2086 # (the setting is three words)
    line=$(taskset -c 1 "$bin" "$url" rate $setting "$seconds") # (a failure stops the script)
    echo "run=$run $line"
  done
  for setting in "2 100 1000" "4 1000 1000" "2 50 100"; do
    # shellcheck disable=SC2086
    line=$(taskset -c 1 "$bin" "$url" queue-rate $setting "$seconds")
    echo "run=$run $line"
  done
  for noisy in 1 4 16; do
    line=$(taskset -c 1 "$bin" "$url" fairness "$seconds" "$noisy")
    echo "run=$run $line"
  done
  for groups in 160 16; do
    for n in 1 4; do
      line=$(taskset -c 1 "$bin" "$url" weights "$seconds" "$groups" "$n")
      echo "run=$run $line"
    done
  done
  line=$(taskset -c 1 "$bin" "$url" priorities "$seconds")
  echo "run=$run $line"
  for priority in 0 2; do
    line=$(taskset -c 1 "$bin" "$url" priorities "$seconds" 1000 "$priority")
    echo "run=$run $line"
  done
done
