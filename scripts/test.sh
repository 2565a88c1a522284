#!/usr/bin/env bash
# Sets up and runs every test: builds twice (warnings as errors; ASan+UBSan), runs all tests in
# both against a throw-away redis-server and a throw-away Redis Cluster on loopback, and checks
# formatting.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/setup.sh

echo "== format"
files=$(git ls-files '*.cpp' '*.hpp')
clang-format --dry-run --Werror $files

# Debug information is line tables only (-g1): enough for every backtrace, and the builds take
# a fifth less time than with full -g.
echo "== build: release, -Werror"
scripts/build.sh build/ci-release -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
  -DJOBRT_WERROR=ON
echo "== install, and build a separate project against it (find_package(jobrt))"
rm -rf build/ci-install build/ci-consumer
cmake --install build/ci-release --prefix build/ci-install >/dev/null
cmake -S tests/consumer -B build/ci-consumer -DCMAKE_PREFIX_PATH="$root/build/ci-install" >/dev/null
cmake --build build/ci-consumer -j "$(nproc)" >/dev/null
build/ci-consumer/consumer
# The plugin it built is docs/HANDLERS.md's example, word for word.
diff <(awk '/^```cpp$/{on=1; next} on && /^```$/{exit} on' docs/HANDLERS.md) <(tail -n +2 tests/consumer/greet.cpp) ||
  { echo "docs/HANDLERS.md's example and tests/consumer/greet.cpp differ"; exit 1; }

echo "== build: ASan+UBSan"
scripts/build.sh build/ci-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DJOBRT_WERROR=ON -DJOBRT_SANITIZE=ON \
  -DJOBRT_BUILD_BENCH=OFF

read -r port dir tls_port < <(TLS=1 scripts/redis.sh)
trap 'scripts/redis.sh stop "$dir"' EXIT
export JOBRT_TEST_REDIS_URL="redis://127.0.0.1:$port"
# The same server over TLS, for the conformance suites' TLS runs.
export JOBRT_TEST_TLS_URL="rediss://127.0.0.1:$tls_port/?ca=$dir/ca.crt"
echo "== redis-server on port $port, TLS on port $tls_port"
# The cluster the conformance suite runs on (the cluster tests start clusters of their own).
read -r cluster_port cluster_dir < <(scripts/cluster.sh start)
trap 'scripts/redis.sh stop "$dir"; scripts/cluster.sh stop "$cluster_dir"' EXIT
export JOBRT_TEST_CLUSTER_URL="redis://127.0.0.1:$cluster_port"
echo "== Redis Cluster on ports $cluster_port to $((cluster_port + 5))"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
echo "== tests: ci-release"
ctest --test-dir build/ci-release --output-on-failure -j "$(nproc)"
# Under the sanitizers, all but the longest runs of scale and faults, whose code the other
# cases cover there too (the release run has them all): the million-job queue, the cluster's
# primary kills and reshards, and chaos on a cluster. (CI must stay under 30 minutes.)
echo "== tests: ci-asan"
ctest --test-dir build/ci-asan --output-on-failure -j "$(nproc)" \
  -E "a queue of a million jobs|a primary killed under load|slot moves by hand and a reshard"

echo "== benchmark suite, smoke mode (small counts: it must run, not be fast)"
JOBS="$(nproc)" scripts/bench-smoke.sh build/ci-release
