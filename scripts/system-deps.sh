#!/usr/bin/env bash
# Debian packages the test suite drives: Chromium (browser tests) and Prometheus (scrape test).
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "missing ${need[*]}: run as root or: sudo apt-get install -y ${need[*]}" >&2
  exit 1
fi
echo "installing ${need[*]} from Debian ..."
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
