#!/usr/bin/env python
"""Per call of a bench row: how long the host takes to issue it and how long the GPU takes to run
it, for each compiler and mode, measured apart.

    python bench/host_device_split.py --rows bert_1x8_bf16,llama_decode_bf16 [--calls 50]

The GPU is first held busy by a spin kernel (torch.cuda._sleep) long enough for the host to
queue `calls` calls behind it: the host's time per call is then what issuing one costs (guards,
input fetches, copies, the launch or replay), free of any wait for the GPU. CUDA events around
the queued calls then time the GPU running them back to back: its time per call, free of host
gaps. A call slower than both is paying for their alternation; a call that waits on the GPU
(a synchronization) shows as host time near the spin's length and is reported as such.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-split-")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

bench.torch = torch
sys.path.insert(0, bench.REPO)
import kiln  # noqa: E402


def split(fn, args, calls: int, before=None) -> tuple:
    """(host µs per call or None where the calls waited for the GPU, GPU µs per call, wall µs per
    call when alternating as usual)."""
    def one():
        if before:
            before()
        return fn(*args)
    for _ in range(5):
        one()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        one()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / calls * 1e6
    # Hold the GPU long enough for every call to be queued behind the spin.
    spin_us = max(wall * calls * 4, 200_000)
    spin_cycles = int(spin_us * 1.98e3)  # ~1.98 GHz: cycles per µs
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(spin_cycles)
    start.record()
    t0 = time.perf_counter()
    for _ in range(calls):
        one()
    host = (time.perf_counter() - t0) / calls * 1e6
    end.record()
    torch.cuda.synchronize()
    gpu = start.elapsed_time(end) * 1e3 / calls
    # Issuing took most of the spin: some call waited for the GPU (a synchronization, a full
    # launch queue), so the host's own time is not known.
    return (None if host * calls > 0.5 * spin_us else host), gpu, wall


def fmt(host) -> str:
    return "waits for the GPU" if host is None else f"{host:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="bert_1x8_bf16")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--modes", default="default,reduce-overhead")
    ap.add_argument("--no-tc", action="store_true")
    opts = ap.parse_args()
    print("| row | compiler | mode | host µs/call | GPU µs/call | wall µs/call |")
    print("|---|---|---|---:|---:|---:|")
    for name in opts.rows.split(","):
        fn, args = bench.build_row(name, "cuda")
        with torch.no_grad():
            for mode in opts.modes.split(","):
                kiln.reset()
                compiled = kiln.compile(fn, mode=mode)
                h, g, w = split(compiled, args, opts.calls)
                print(f"| {name} | kiln | {mode} | {fmt(h)} | {g:.1f} | {w:.1f} |", flush=True)
                if opts.no_tc:
                    continue
                torch._dynamo.reset()
                tc = torch.compile(fn, mode=mode)
                before = torch.compiler.cudagraph_mark_step_begin if mode != "default" else None
                h, g, w = split(tc, args, opts.calls, before)
                print(f"| {name} | torch.compile | {mode} | {fmt(h)} | {g:.1f} | {w:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
