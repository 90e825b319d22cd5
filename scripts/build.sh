#!/usr/bin/env bash
# Developer build: configures once, rebuilds incrementally, and drops kiln/_C*.so into the
# source tree so `import kiln` works from the checkout. Build files live outside the clone.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
build=${KILN_BUILD_DIR:-${KILN_HOME:-$HOME/.kiln-dev}/build-$(echo "$root" | md5sum | cut -c1-8)}
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$(command -v "$python")" >/dev/null
fi
cmake --build "$build" -j "${KILN_JOBS:-2}"
# Atomic replace: Python processes that have the old module mapped keep working.
for so in "$build"/_C*.so; do
  cp -f "$so" "$root/kiln/.$(basename "$so").tmp"
  mv -f "$root/kiln/.$(basename "$so").tmp" "$root/kiln/$(basename "$so")"
done
echo "$build"
