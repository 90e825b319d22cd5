#!/usr/bin/env bash
# Sets up (once), builds, and runs the quickstart demo.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh"
venv=${KILN_HOME:-$HOME/.kiln-dev}/venv
export PATH="$venv/bin:$PATH"
bash "$root/scripts/build.sh" >/dev/null
cd "$root"
PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" python examples/quickstart.py "$@"
