#!/usr/bin/env bash
# Runs every test: the core's GoogleTest suite, then the Python suite against eager PyTorch.
# GPU tests are marked and skip where there is no CUDA device.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh"
venv=${KILN_HOME:-$HOME/.kiln-dev}/venv
export PATH="$venv/bin:$PATH"
build=$(bash "$root/scripts/build.sh" | tail -n 1)
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$(mktemp -d /tmp/kiln-test-cache.XXXXXX)}
if [ -x "$build/kiln_core_tests" ]; then
  "$build/kiln_core_tests" --gtest_brief=1
fi
cd "$root"
PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" python -m pytest -q -x tests/python "$@"
