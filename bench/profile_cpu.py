#!/usr/bin/env python
"""Where the CPU time of a bench row goes: kiln's steps against torch.compile's operators.

    python bench/profile_cpu.py --rows bert_1x8,vit_b_16 [--calls 20] [--top 20]

For each row (bench/bench.py's, built the same way, float32 on the CPU): the wall time per call
of eager, torch.compile and kiln, interleaved in one process; kiln's steps timed one by one
(kiln._C._profile_steps: each generated kernel and each torch operator the program calls, summed
over the calls), and the gap between their sum and kiln's wall time (guards, inputs, outputs,
allocation); torch.compile's and eager's aten operators under torch.profiler, with the time
outside them (inductor's own kernels and its wrapper). Profiled calls run slower than unprofiled
ones: compare the breakdowns with each other, the wall times with bench.py's.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time

os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-profile-")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

bench.torch = torch  # bench.py's workloads read the module global its workers set

sys.path.insert(0, bench.REPO)
import kiln  # noqa: E402


def wall_us(fn, args, calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2] * 1e6


def kiln_steps(fn, args, calls: int) -> list:
    kiln._C._profile_steps(True)
    for _ in range(calls):
        fn(*args)
    return kiln._C._profile_steps(False)


def torch_ops(fn, args, calls: int) -> tuple:
    """(top-level aten operators as {name: [µs, count]} per call, wall µs per profiled call)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        wall = (time.perf_counter() - t0) / calls * 1e6
    events = [e for e in prof.events() if e.name.startswith(("aten::", "mkldnn::", "mkl::", "onednn::"))]
    # operators not called by another operator: time inside them is counted once
    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in events)
    top, end = [], -1
    for s, e, n in spans:
        if s >= end:
            top.append((s, e, n))
            end = e
    by = collections.defaultdict(lambda: [0.0, 0])
    for s, e, n in top:
        by[n][0] += (e - s) / calls
        by[n][1] += 1 / calls
    return by, wall


def print_table(title: str, rows: list, total: float, wall: float, top: int) -> None:
    print(f"\n{title}: {total:.1f} µs in the listed steps, {wall:.1f} µs wall per profiled call, "
          f"{wall - total:.1f} µs outside them")
    for label, us, count in sorted(rows, key=lambda r: -r[1])[:top]:
        print(f"  {us:9.1f} µs  x{count:<4.0f} {label[:100]}")


def profile_row(name: str, calls: int, top: int) -> None:
    print(f"\n===== {name} ({torch.get_num_threads()} threads) =====", flush=True)
    fn, args = bench.build_row(name, "cpu")
    with torch.no_grad():
        ref = fn(*args)
        kiln.reset()
        ours = kiln.compile(fn)
        out = ours(*args)
        bad = bench.check(out, ref, bench.check_tol(name, "cpu"))
        if bad:
            print("kiln result differs from eager:", bad)
        torch._dynamo.reset()
        tc = torch.compile(fn)
        tc(*args)
        for f in (fn, tc, ours):
            f(*args)
        walls = {"eager": [], "torch.compile": [], "kiln": []}
        for _ in range(3):  # interleaved, so that the machine's drift touches all three
            for label, f in (("eager", fn), ("torch.compile", tc), ("kiln", ours)):
                walls[label].append(wall_us(f, args, calls))
        print("wall µs per call (median of 3 interleaved rounds): " +
              ", ".join(f"{k} {sorted(v)[1]:.1f}" for k, v in walls.items()))
        steps = kiln_steps(ours, args, calls)
        t0 = time.perf_counter()
        for _ in range(calls):
            ours(*args)
        kiln_wall = (time.perf_counter() - t0) / calls * 1e6
        rows = [(label, sec / calls * 1e6, runs / calls) for label, sec, runs in steps]
        kernels = sum(us for label, us, _ in rows if label.startswith("kernel "))
        print(f"\nkiln: {sum(c for _, _, c in rows):.0f} steps per call, {kernels:.1f} µs in its own kernels, "
              f"{sum(us for _, us, _ in rows) - kernels:.1f} µs in torch operators")
        print_table("kiln steps", rows, sum(us for _, us, _ in rows), kiln_wall, top)
        for label, f in (("torch.compile", tc), ("eager", fn)):
            by, wall = torch_ops(f, args, calls)
            print_table(f"{label} operators (torch.profiler)", [(k, v[0], v[1]) for k, v in by.items()],
                        sum(v[0] for v in by.values()), wall, top)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="bert_1x8")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    for name in args.rows.split(","):
        profile_row(name, args.calls, args.top)


if __name__ == "__main__":
    main()
