#!/usr/bin/env python
"""First call of a model on the CPU (capture, compile, one run) with an empty kernel cache, and
how long the C++ compiler took, for a given number of translation units.

    python bench/cpu_compile.py bert --units 1
    python bench/cpu_compile.py resnet18            # kiln's own split (one unit per core)

Each run is a fresh process with a fresh KILN_CACHE_DIR, so nothing comes from the disk cache.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

CHILD = r"""
import sys, time, torch, kiln
torch.manual_seed(0)
if sys.argv[1] == "bert":
    import transformers
    model, args = transformers.BertModel(transformers.BertConfig()).eval(), (torch.randint(0, 1000, (1, 8)),)
else:
    import torchvision
    model, args = torchvision.models.resnet18().eval(), (torch.randn(2, 3, 224, 224),)
with torch.no_grad():
    ref = model(*args)
    t = time.perf_counter()
    out = kiln.compile(model)(*args)
    dt = time.perf_counter() - t
first = lambda r: r[0] if isinstance(r, (tuple, list)) or hasattr(r, "last_hidden_state") else r
err = (first(out) - first(ref)).abs().max().item()
print(f"FIRST {dt:.3f} ERR {err:.2e} FALLBACKS {kiln.stats()['eager_fallbacks']}")
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=["bert", "resnet18"])
    ap.add_argument("--units", type=int, default=0, help="translation units (0: kiln's choice)")
    ap.add_argument("--runs", type=int, default=2)
    opts = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for _ in range(opts.runs):
        env = dict(os.environ, KILN_CACHE_DIR=tempfile.mkdtemp(prefix="kiln-cpu-compile-"), KILN_LOGS="timing",
                   PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.pop("KILN_CPU_UNITS", None)
        if opts.units:
            env["KILN_CPU_UNITS"] = str(opts.units)
        r = subprocess.run([sys.executable, "-c", CHILD, opts.model], env=env, capture_output=True, text=True)
        cxx = re.search(r"C\+\+ compiler (\d+ ms) for (\d+) units", r.stderr)
        first = re.search(r"FIRST (\S+) ERR (\S+) FALLBACKS (\d+)", r.stdout)
        if r.returncode or not cxx or not first:
            print(r.stdout[-2000:], r.stderr[-2000:])
            return 1
        print(f"{opts.model}: C++ compiler {cxx.group(1)} in {cxx.group(2)} units, first call {first.group(1)} s "
              f"(max error {first.group(2)}, eager fallbacks {first.group(3)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
