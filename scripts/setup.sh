#!/usr/bin/env bash
# Installs everything gyre needs to build and test on a fresh Debian machine.
# Idempotent: packages already present are not fetched again.
set -euo pipefail

# clang and its runtime (libFuzzer): the fuzz targets of tests/fuzz.
# ccache: the suite builds the same sources in several trees (scripts/env.sh).
apt_packages=(build-essential cmake libopenmpi-dev openmpi-bin catch2 libfmt-dev libdlpack-dev iproute2
              clang-14 libclang-rt-14-dev ccache)
# A Python with pip and headers, unless one is already on PATH (pyenv, venv).
if ! python3 -m pip --version >/dev/null 2>&1; then
  apt_packages+=(python3-dev python3-pip python3-venv)
fi
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

# Python: the build tools, the test tools, PyTorch's CPU build (the pin is the
# one tested; a newer one downloads gigabytes), then gyre itself. The
# extension builds in build/python (pyproject.toml), so re-running this only
# recompiles what changed.
export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
root=$(cd "$(dirname "$0")/.." && pwd)
python3 -m pip install -q "torch==2.13.0" numpy pytest pytest-timeout mock cloudpickle packaging expecttest pybind11 "scikit-build-core>=0.10"
# The GPU path compiles wherever the CUDA toolkit is installed (a GPU is only
# needed to run its tests): NCCL's headers and library come from PyPI.
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  python3 -m pip install -q nvidia-nccl-cu12
fi
source "$root/scripts/env.sh"  # the compiler cache for the extension's build
python3 -m pip install -q --no-build-isolation --no-deps "$root"
