#!/usr/bin/env python
"""Capture time: kiln's bytecode interpreter against torch._dynamo's, in one process.

    python bench/capture.py [--repeat 5] [--out docs/benchmarks.md]

Workloads:
  straight-line   a generated function of 1,000 tensor operations (sin, mul, add, tanh, relu
                  in turn), no control flow
  sequential-50   nn.Sequential of 50 layers (25 x Linear(64, 64) + ReLU), input (8, 64)
  unrolled-2000   a Python loop of 2,000 iterations (a multiply-add each, its result appended to
                  a list): capture must stay linear in the number of instructions it runs

What is measured (median of --repeat runs, each after resetting both compilers):
  torch._dynamo   the first call of torch.compile(fn, backend=<a backend that returns the
                  graph's forward unchanged>), minus one later call: Dynamo's bytecode analysis,
                  guards and code generation, without AOTAutograd or Inductor
  kiln capture    kiln.stats()["capture_seconds"] for the first call: bytecode analysis into a
                  graph and guards, without kiln's own compile
  kiln 1st call   the whole first call of kiln.compile(fn): capture, compile (C++ with a fresh
                  disk cache) and one run
Everything runs under torch.no_grad() and every result is checked against eager.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-capture-bench-"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import kiln  # noqa: E402


def straight_line(n: int = 1000):
    lines = ["def straight_line(x):", "    y = x"]
    forms = ["    y = torch.sin(y)", "    y = y * 0.5", "    y = y + x", "    y = y.tanh()", "    y = torch.relu(y)"]
    for i in range(n):
        lines.append(forms[i % len(forms)])
    lines.append("    return y")
    scope = {"torch": torch}
    exec(compile("\n".join(lines), "<straight_line_1000>", "exec"), scope)
    return scope["straight_line"], (torch.randn(16),)


def sequential(n: int = 50):
    layers = []
    for _ in range(n // 2):
        layers += [nn.Linear(64, 64), nn.ReLU()]
    return nn.Sequential(*layers).eval(), (torch.randn(8, 64),)


def unrolled_loop(n: int = 2000):
    def unrolled(x):
        outs = []
        for i in range(n):
            x = x * 0.999 + i % 3
            outs.append(x)
        return outs[-1] + outs[0]
    return unrolled, (torch.randn(16),)


def passthrough_backend(gm, example_inputs):
    return gm.forward


def time_dynamo(fn, args) -> float:
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=passthrough_backend)
    t0 = time.perf_counter()
    out = compiled(*args)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled(*args)
    again = time.perf_counter() - t0
    torch.testing.assert_close(out, fn(*args))
    return first - again


def time_kiln(fn, args) -> tuple[float, float]:
    kiln.reset()
    os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-capture-bench-")  # compile afresh
    compiled = kiln.compile(fn)
    t0 = time.perf_counter()
    out = compiled(*args)
    first = time.perf_counter() - t0
    torch.testing.assert_close(out, fn(*args))
    s = kiln.stats()
    assert s["graphs_compiled"] == 1 and s["graph_breaks"] == 0 and s["eager_fallbacks"] == 0, s
    return s["capture_seconds"], first


def fmt(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", help="append the table as a markdown section to this file")
    opts = ap.parse_args()
    rows = []
    with torch.no_grad():
        for title, make in (("1,000-op straight-line function", straight_line), ("50-layer nn.Sequential", sequential),
                            ("2,000-iteration unrolled loop", unrolled_loop)):
            fn, args = make()
            time_kiln(fn, args)  # first use of each code path (imports, compiler probe) left out
            dyn = statistics.median(time_dynamo(fn, args) for _ in range(opts.repeat))
            runs = [time_kiln(fn, args) for _ in range(opts.repeat)]
            cap = statistics.median(r[0] for r in runs)
            first = statistics.median(r[1] for r in runs)
            rows.append((title, dyn, cap, first))
            print(f"{title}: dynamo {fmt(dyn)}, kiln capture {fmt(cap)} ({dyn / cap:.0f}x), kiln 1st call {fmt(first)}",
                  flush=True)
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    section = [f"## Capture time: {cpu}, {os.cpu_count()} cores",
               "",
               f"{datetime.datetime.now():%Y-%m-%d %H:%M}; torch {torch.__version__}, Python {platform.python_version()}; "
               f"`python bench/capture.py --repeat {opts.repeat}`. Medians; ratio = torch._dynamo ÷ kiln capture.",
               "",
               "| workload | torch._dynamo (bytecode → FX graph) | kiln capture | ratio | kiln 1st call (capture + compile + run) |",
               "|---|---:|---:|---:|---:|"]
    for title, dyn, cap, first in rows:
        section.append(f"| {title} | {fmt(dyn)} | {fmt(cap)} | {dyn / cap:.0f}x | {fmt(first)} |")
    text = "\n".join(section) + "\n"
    print(text)
    if opts.out:
        with open(opts.out, "a") as f:
            f.write("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
