#!/usr/bin/env bash
# The bridges against bare consumers of the same sources, in one run (issue 28's goals):
#   stream   N entries: a bare XREADGROUP+XACK client's messages/s, then jobrt bridge's (a
#            stream_bridge storing them as jobs, no worker), and bridge ÷ bare; at the bridge's
#            default batch (200) and at 1000
#   amqp     the same with a RabbitMQ queue: a bare librabbitmq consumer (an ack a message)
#   latency  publish to handler start through each bridge, p50 and p99 of 300 messages sent
#            one at a time, 1 ms apart, a worker running the queue
# Usage: bench/bridge.sh [N=50000] [RUNS=3]   (BUILD=0 to use build/release as is)
# Redis on core 0, the client on core 1 (RabbitMQ where the kernel puts it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
n=${1:-50000} runs=${2:-3}
build_dir=${BUILD_DIR:-$root/build/release}
if [ "${BUILD:-1}" = 1 ]; then
  scripts/setup.sh
  scripts/build.sh "$build_dir" -DCMAKE_BUILD_TYPE=Release -DJOBRT_BUILD_TESTS=OFF >/dev/null
  cmake --build "$build_dir" --parallel "${JOBS:-1}" --target jobrt_bench_bridge >/dev/null
fi
bin=$build_dir/bench/jobrt_bench_bridge
[ -x "$bin" ] || { echo "bench/bridge.sh: $bin is not built" >&2; exit 1; }
read -r port rdir < <(scripts/redis.sh)
read -r mq_port mq_dir < <(scripts/rabbitmq.sh)
trap 'scripts/redis.sh stop "$rdir"; scripts/rabbitmq.sh stop "$mq_dir"' EXIT
taskset -cp 0 "$(cat "$rdir/redis.pid")" >/dev/null
url=redis://127.0.0.1:$port
for run in $(seq "$runs"); do
  echo "run $run"
  for batch in 200 1000; do
    taskset -c 1 "$bin" "$url" stream "$n" "$batch"
    taskset -c 1 "$bin" "$url" amqp "$n" "$mq_port" "$batch"
  done
  taskset -c 1 "$bin" "$url" latency 300 stream
  taskset -c 1 "$bin" "$url" latency 300 amqp "$mq_port"
done
