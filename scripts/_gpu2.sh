#!/usr/bin/env bash
set -uo pipefail
export PYTHONUNBUFFERED=1 KILN_HOME=/tmp/kiln-home
lscpu | grep -E "Model name|^CPU\(s\)|Thread|NUMA node\(s\)|Flags" | cut -c1-200
PYTHON=python3 KILN_JOBS=16 bash scripts/build.sh > $OUT/build.log 2>&1; echo "build rc=$?"
export PYTHONPATH=$PWD
timeout 400 python3 bench/profile_cpu.py --rows bert_1x8,gelu,softmax,vit_b_16 --calls 10 --top 14 2>&1 | grep -v "USDT\|ERROR:\|W11" | tee $OUT/profile_cpu.log
