#!/usr/bin/env bash
# Makes a docker engine answer for the docker backend's tests, and builds the sandbox
# image for this runtime. An engine that already answers (a workstation's Docker, or
# DOCKER_HOST) is used as it is; otherwise, as root on Debian, docker.io is installed
# and dockerd started. Exits non-zero when no engine can be brought up.
set -euo pipefail
cd "$(dirname "$0")/.."

answers() { docker info >/dev/null 2>&1; }

if ! answers; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "no docker engine answers, and one cannot be installed from here (needs root and apt-get)" >&2
    exit 1
  fi
  if ! command -v dockerd >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
    echo "== installing docker.io and debootstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null
  fi
  echo "== starting dockerd"
  nohup dockerd >/var/log/clawsup-dockerd.log 2>&1 &
  for _ in $(seq 120); do answers && break; sleep 0.5; done  # bounded: 60 s
  answers || { echo "dockerd did not come up:" >&2; tail -20 /var/log/clawsup-dockerd.log >&2; exit 1; }
fi
if ! command -v debootstrap >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
bash scripts/build-sandbox-image
