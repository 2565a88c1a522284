#!/usr/bin/env bash
# Installs what jobrt needs to build, test and run, all from Debian's packages.
# Idempotent: when everything is there it only checks (well under a second).
set -euo pipefail

packages=(
  g++ cmake ninja-build pkg-config
  libboost1.81-dev libboost-json1.81-dev libboost-url1.81-dev
  libfmt-dev doctest-dev libhiredis-dev libcli11-dev libssl-dev openssl librabbitmq-dev libhowardhinnant-date-dev tzdata
  redis-server redis-sentinel redis-tools rabbitmq-server clang-format
  chromium
)
# Node.js and npm run the dashboard's browser tests (playwright-core); the machine's own when it
# has them.
command -v npm >/dev/null || packages+=(nodejs npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The browser tests' driver, playwright-core, at the version package-lock.json pins (it drives
# Debian's chromium: it downloads no browser).
root=$(cd "$(dirname "$0")/.." && pwd)
if [ ! -d "$root/tests/dashboard/node_modules/playwright-core" ]; then
  echo "setup: npm ci in tests/dashboard"
  (cd "$root/tests/dashboard" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi
