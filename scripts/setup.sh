#!/usr/bin/env bash
# Installs everything gyre needs to build and test on a fresh Debian machine.
# Idempotent: packages already present are not fetched again.
set -euo pipefail

apt_packages=(build-essential cmake libopenmpi-dev openmpi-bin catch2 libfmt-dev)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
