#!/usr/bin/env bash
# Sets up, builds and runs the demo on the embedded backend: scripts/demo.sh [demo options]
# The build's progress goes to stderr, so that stdout carries the demo's own output only.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
echo "demo: building jobrt and its plugins in $root/build/demo (Release)" >&2
"$root/scripts/build.sh" "$root/build/demo" -DCMAKE_BUILD_TYPE=Release -DJOBRT_BUILD_TESTS=OFF -DJOBRT_BUILD_BENCH=OFF >&2
echo "demo: running $root/build/demo/runtime/jobrt demo $*" >&2
exec "$root/build/demo/runtime/jobrt" demo "$@"
