#!/usr/bin/env python
"""Where the GPU time of a bench row goes: kiln's kernels against torch.compile's, side by side.

    python bench/profile_gpu.py --rows bert_8x128_bf16,resnet18_bf16 [--calls 10] [--top 25]

For each row (the rows of bench/bench.py, built the same way): kiln's first call with fresh caches
and KILN_LOGS=timing (where compilation spends its time, on stderr), then both compilers in mode
default under torch.profiler: per call, the number of kernels, their summed device time and the
wall time, and the kernels that take the most device time, grouped by name. Summed kernel time is
what a CUDA-graph replay costs (replays remove the launch gaps, not the kernels). kiln compiles
every kernel as a translation unit named `kiln_kernel`; its launches are named here after
kiln.explain's kernel list, in program order.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time

os.environ.setdefault("KILN_LOGS", "timing")
os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-profile-")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

bench.torch = torch  # bench.py's workloads read the module global its workers set

sys.path.insert(0, bench.REPO)
import kiln  # noqa: E402


def kernel_events(fn, args, calls: int) -> tuple:
    """(device kernels in launch order as (name, µs), wall µs per call) over `calls` calls."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / calls * 1e6
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(*args)
        torch.cuda.synchronize()
    events = [(e.name, e.device_time) for e in prof.events()
              if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith("Memcpy")
              and not e.name.startswith("Memset")]
    return events, wall


def print_torch_ops(fn, args) -> None:
    """The aten operators a call runs (kiln's externs and what they call inside), by count."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    ops = sorted(((e.key, e.count) for e in prof.key_averages() if e.key.startswith("aten::")), key=lambda kv: -kv[1])
    print("  torch operators per call: " + ", ".join(f"{k[6:]} x{c}" for k, c in ops[:24]))


def name_kiln_launches(events: list, names: list, calls: int) -> list:
    launches = [i for i, (n, _) in enumerate(events) if n == "kiln_kernel"]
    if not names or len(launches) != len(names) * calls:
        return events
    out = list(events)
    for j, i in enumerate(launches):
        out[i] = (names[j % len(names)], events[i][1])
    return out


def summarize(label: str, events: list, wall: float, calls: int, top: int) -> None:
    by_name = collections.defaultdict(lambda: [0.0, 0])
    for n, us in events:
        by_name[n][0] += us
        by_name[n][1] += 1
    total = sum(us for _, us in events) / calls
    print(f"\n{label}: {len(events) / calls:.0f} kernels per call, {total:.1f} µs of kernels, "
          f"{wall:.1f} µs wall per call")
    for n, (us, count) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {us / calls:9.1f} µs  x{count / calls:<5.0f} {n[:110]}")


def profile_row(name: str, calls: int, top: int) -> None:
    print(f"\n===== {name} =====", flush=True)
    fn, args = bench.build_row(name, "cuda")
    with torch.no_grad():
        ref = fn(*args)
        kiln.reset()
        compiled = kiln.compile(fn)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = compiled(*args)
        torch.cuda.synchronize()
        st = kiln.stats()
        print(f"kiln first call {time.perf_counter() - t0:.3f} s (capture {st['capture_seconds']:.3f} s, "
              f"compile {st['compile_seconds']:.3f} s, {st['kernels_generated']} kernels, "
              f"eager fallbacks {st['eager_fallbacks']})", flush=True)
        bad = bench.check(out, ref, bench.check_tol(name, "cuda"))
        if bad:
            print("kiln result differs from eager:", bad)
        names = [k.name for k in kiln.explain(fn)(*args).kernels]
        events, wall = kernel_events(compiled, args, calls)
        summarize("kiln", name_kiln_launches(events, names, calls), wall, calls, top)
        print_torch_ops(compiled, args)
        torch._dynamo.reset()
        tc = torch.compile(fn)
        tc(*args)
        events, wall = kernel_events(tc, args, calls)
        summarize("torch.compile", events, wall, calls, top)
        events, wall = kernel_events(fn, args, calls)
        summarize("eager", events, wall, calls, min(top, 8))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="bert_8x128_bf16")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--top", type=int, default=25)
    opts = ap.parse_args()
    for name in bench.expand_rows(opts.rows):
        try:
            profile_row(name, opts.calls, opts.top)
        except Exception as e:  # noqa: BLE001
            print(f"{name}: {type(e).__name__}: {e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
