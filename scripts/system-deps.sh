#!/usr/bin/env bash
# Debian packages the test suite drives: Chromium (browser tests), Prometheus (scrape test), nginx (the load
# balancer config, tests/deploy), and Slurm with munge
# (tests/slurm: a one-node Slurm the tests start as root and stop again; about 55 s).
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
command -v slurmctld >/dev/null 2>&1 || need+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || need+=(munge)
command -v openssl >/dev/null 2>&1 || need+=(openssl)  # the certificate of tests/deploy's API server
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "missing ${need[*]}: run as root or: sudo apt-get install -y ${need[*]}" >&2
  exit 1
fi
echo "installing ${need[*]} from Debian ..."
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
