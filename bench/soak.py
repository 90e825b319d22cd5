"""Soak test: does kiln's memory stay flat?

1. Compiled functions created, called and dropped N times (each a fresh closure, so a fresh
   function object; the code object is shared, as a def inside a loop shares it).
2. Functions with fresh code objects (exec'd source) created, called and dropped N times.
3. M calls of one compiled MLP.

Prints the resident set size (RSS) after warm-up and at checkpoints. Usage:

    python bench/soak.py --functions 10000 --calls 1000000
"""
from __future__ import annotations

import argparse
import gc
import os
import time

import torch

import kiln


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def fresh_closures(n: int, checkpoints: int = 5) -> list:
    x = torch.randn(16)
    rows = []
    for i in range(n):
        scale = float(i % 7)

        def fn(t):
            return (t * scale + 1.0).relu()

        kiln.compile(fn)(x)
        if (i + 1) % max(1, n // checkpoints) == 0:
            gc.collect()
            rows.append((i + 1, rss_mb()))
    return rows


def fresh_code_objects(n: int, checkpoints: int = 5) -> list:
    x = torch.randn(16)
    rows = []
    for i in range(n):
        ns: dict = {"torch": torch}
        # one source text per call: a new code object each time (the kernel itself is shared
        # through the disk and memory caches, as the graph is the same)
        exec(compile(f"def fn(t):\n    return (t * 2.0 + 1.0).relu()  # {i}\n", f"<soak-{i}>", "exec"), ns)
        kiln.compile(ns["fn"])(x)
        del ns
        if (i + 1) % max(1, n // checkpoints) == 0:
            gc.collect()
            rows.append((i + 1, rss_mb()))
    return rows


def mlp_calls(m: int, checkpoints: int = 5) -> list:
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64)).eval()
    cm = kiln.compile(mlp)
    x = torch.randn(8, 64)
    rows = []
    with torch.no_grad():
        for i in range(m):
            cm(x)
            if (i + 1) % max(1, m // checkpoints) == 0:
                gc.collect()
                rows.append((i + 1, rss_mb()))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--functions", type=int, default=10000)
    ap.add_argument("--calls", type=int, default=1000000)
    args = ap.parse_args()
    kiln.config.suppress_fallback_warnings = True
    for name, run, n in (("fresh closures", fresh_closures, args.functions),
                         ("fresh code objects", fresh_code_objects, args.functions),
                         ("MLP calls", mlp_calls, args.calls)):
        run(max(1, n // 100))  # warm-up: caches, allocator, first compiles
        gc.collect()
        start = rss_mb()
        t0 = time.perf_counter()
        rows = run(n)
        dt = time.perf_counter() - t0
        print(f"{name}: {n} in {dt:.1f} s; RSS after warm-up {start:.1f} MB; " +
              ", ".join(f"{k}: {v:.1f} MB" for k, v in rows) + f"; growth {rows[-1][1] - start:+.1f} MB")


if __name__ == "__main__":
    main()
