#!/usr/bin/env bash
# On the GPU machine (device tool): build kiln against the machine's torch, run the GPU tests,
# the demo and the benchmark. Writes logs and the benchmark table under $OUT when set.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 KILN_CACHE_DIR=$(mktemp -d /tmp/kiln-cache.XXXXXX) KILN_HOME=/tmp/kiln-home
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0))"
PYTHON=python3 KILN_JOBS=16 bash "$root/scripts/build.sh" 2>&1 | tail -n 3
cd "$root"
export PYTHONPATH=$root
python3 -m pytest -q -x -m gpu tests/python 2>&1 | tee "$out/gpu_tests.log" | tail -n 30
if [ "${KILN_GPU_ALL:-0}" = 1 ]; then
  python3 -m pytest -q tests/python 2>&1 | tee "$out/all_tests.log" | tail -n 15
fi
python3 examples/quickstart.py --device cuda 2>&1 | tee "$out/quickstart.log" | tail -n 20
if [ "${KILN_GPU_BENCH:-1}" = 1 ]; then
  python3 bench/bench.py --device cuda --out "$out/bench_cuda.md" 2>&1 | tee "$out/bench.log" | tail -n 30
fi
