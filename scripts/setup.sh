#!/usr/bin/env bash
# Installs what kiln needs, once: a venv (outside the clone) with torch from this machine's
# disk, the build tools, GoogleTest. Idempotent: a second run only checks a stamp.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
home=${KILN_HOME:-$HOME/.kiln-dev}
venv=$home/venv
reqs="torch==2.14.1 torchvision==0.29.1 transformers==5.23.0 nanobind>=2.0 scikit-build-core>=0.8 pytest numpy ninja cmake>=3.25 expecttest einops"
stamp=$venv/.kiln-reqs-$(echo "$reqs" | md5sum | cut -c1-12)
mkdir -p "$home"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if [ ! -f "$stamp" ]; then
  "$venv/bin/pip" install -q --disable-pip-version-check $reqs
  touch "$stamp"
fi
if [ ! -f /usr/include/gtest/gtest.h ]; then
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && apt-get install -y -qq libgtest-dev) >/dev/null 2>&1 || echo "warning: could not install libgtest-dev; C++ unit tests are skipped" >&2
  else
    echo "warning: libgtest-dev is missing and this is not root; C++ unit tests are skipped" >&2
  fi
fi
