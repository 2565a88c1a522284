#!/usr/bin/env bash
# Sets up, builds and runs the demo on the embedded backend: scripts/demo.sh [demo options]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh" "$root/build/demo" -DCMAKE_BUILD_TYPE=Release -DJOBRT_BUILD_TESTS=OFF -DJOBRT_BUILD_BENCH=OFF >/dev/null
exec "$root/build/demo/runtime/jobrt" demo "$@"
