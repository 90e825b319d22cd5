#!/usr/bin/env python
"""Where a first call's time goes, per bench row: capture, compile (code generation and the
kernel compiler), and the rest (loading kernels, the run itself), with empty caches.

    python bench/first_call.py --device cuda --rows sincos,gelu,softmax

Each row runs in a fresh process, so that no compiler state or cache is shared with another,
twice: once as the process's first compile ("cold"), and once after kiln has compiled an
unrelated kernel and torch has loaded its fused attention in that process ("warm": what
bench.py's first-call column measures, which leaves one-time start-up out for torch.compile and
kiln alike). Their difference is one-time start-up: mostly loading NVRTC and its built-ins.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child(row: str, device: str, warm: bool) -> None:
    os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-first-")
    import torch
    sys.path.insert(0, HERE)
    import bench
    bench.torch = torch
    sys.path.insert(0, bench.REPO)
    import kiln
    fn, args = bench.build_row(row, device)
    if device == "cuda":
        torch.zeros(1, device="cuda")  # the CUDA context: not kiln's time
        torch.cuda.synchronize()
    with torch.no_grad():
        if warm:  # torch's lazily loaded libraries; an unrelated kernel, in another cache
            bench.warm_up_libraries(device)
            os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-warm-")
            kiln.compile(bench._warmup_fn)(torch.ones(8, device=device))
            kiln.reset()
            os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-first-")
        fn(*args)  # eager once: torch's own lazy set-up is not kiln's either
        if device == "cuda":
            torch.cuda.synchronize()
        compiled = kiln.compile(fn)
        t0 = time.perf_counter()
        compiled(*args)
        if device == "cuda":
            torch.cuda.synchronize()
        total = time.perf_counter() - t0
    s = kiln.stats()
    print(json.dumps({"row": row, "total": total, "capture": s["capture_seconds"], "compile": s["compile_seconds"],
                      "kernels": s["kernels_generated"]}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="sincos,gelu,softmax")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--child", default=None)
    ap.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.device, a.warm)
        return 0
    print("| row | process | first call | capture | compile | rest | kernels |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for row in a.rows.split(","):
        for warm in (False, True):
            cmd = [sys.executable, __file__, "--child", row, "--device", a.device] + (["--warm"] if warm else [])
            r = subprocess.run(cmd, capture_output=True, text=True)
            line = [l for l in r.stdout.splitlines() if l.startswith("{")]
            kind = "warm" if warm else "cold"
            if r.returncode or not line:
                why = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode
                print(f"| {row} | {kind} | failed: {why} | | | | |")
                continue
            d = json.loads(line[-1])
            rest = d["total"] - d["capture"] - d["compile"]
            print(f"| {row} | {kind} | {d['total']*1e3:.1f} ms | {d['capture']*1e3:.1f} ms | {d['compile']*1e3:.1f} ms | "
                  f"{rest*1e3:.1f} ms | {d['kernels']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
