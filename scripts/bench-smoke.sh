#!/usr/bin/env bash
# CI's smoke run of the benchmark suite, so it never rots: bench/run --smoke (small counts, one
# run, every scenario and peer, well under 2 minutes once built). Installs what it needs (Node,
# npm, gnuplot, the pinned npm packages); fails on any error or missing result. It writes only
# under bench/results/smoke/ (ignored by git), never docs/BENCHMARKS.md.
#
# Usage: scripts/bench-smoke.sh [BUILD_DIR]
#   BUILD_DIR: a build that has the benchmarks (default: build/ci-release when scripts/test.sh
#   made it, else build/release, configured and built by bench/run).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

build=${1:-}
if [ -z "$build" ] && [ -x build/ci-release/bench/jobrt_bench_handmade ]; then build=build/ci-release; fi
if [ -n "$build" ]; then
  # An existing build is used as it is (bench/run would reconfigure it as Release).
  cmake --build "$build" --parallel "${JOBS:-1}" --target jobrt_bench_jobs jobrt_bench_handmade >/dev/null
  case $build in
    /*) BUILD_DIR=$build ;;
    *) BUILD_DIR=$root/$build ;;
  esac
  export BUILD=0 BUILD_DIR
fi

out=$root/bench/results/smoke
rm -rf "$out"
timeout 900 bench/run --smoke

for f in raw.txt results.csv results.json throughput.svg pickup.svg claim_depth.svg; do
  [ -s "$out/$f" ] || { echo "bench-smoke: $out/$f is missing or empty" >&2; exit 1; }
done
# Every step of the plan left a line: the run stops at the first failure, so this checks the
# report's input once more, by kind.
for kind in "tool=jobrt throughput" "tool=jobrt2 throughput2" "peer=bullmq throughput" "peer=bee throughput" \
    "peer=groupmq throughput" "tool=jobrt pickup" "peer=bee pickup" "peer=bullmq pickup" "peer=groupmq pickup" \
    "tool=jobrt depth" "handmade_depth" "tool=handmade handmade"; do
  grep -q "$kind" "$out/raw.txt" || { echo "bench-smoke: no '$kind' result in $out/raw.txt" >&2; exit 1; }
done
echo "bench-smoke: ok ($(wc -l <"$out/raw.txt") results in $out)"
