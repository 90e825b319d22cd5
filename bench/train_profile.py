"""Where a training step's time goes: torch.profiler over a few steps of one bench/train.py row
for one system, the CUDA kernels (or CPU ops) sorted by their total time.

    python bench/train_profile.py --row resnet18 --system kiln --device cuda
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import train  # noqa: E402  (bench/train.py: the rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--row", default="resnet18")
    ap.add_argument("--system", default="kiln", choices=train.SYSTEMS)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--sort", default="", help="a key_averages column (default: device time, else CPU time)")
    ap.add_argument("--whole", action="store_true", help="compile the whole step function, as bench/train.py does")
    ap.add_argument("--kernels", action="store_true",
                    help="kiln only: name each kiln kernel launch (forward, then backward) after kiln.explain's lists "
                         "and list the kernels by device time")
    ap.add_argument("--show-source", default="", metavar="TEXT",
                    help="with --kernels: print the source of each kiln kernel whose name contains TEXT")
    ap.add_argument("--host", action="store_true",
                    help="kiln only: the host time of each program step (a kernel's launch, a torch operator's "
                         "call) summed over 10 steps, against the step's wall time")
    a = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    model, inputs, loss_fn, amp = train.build(a.row, a.device)
    if a.whole:
        run = model
    elif a.system == "kiln":
        import kiln
        run = kiln.compile(model)
    elif a.system == "torch.compile":
        run = torch.compile(model)
    else:
        run = model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)

    def train_step():
        with torch.autocast(device_type=a.device, dtype=amp or torch.float32, enabled=amp is not None):
            loss = loss_fn(run(*inputs))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step = train_step
    if a.whole and a.system == "kiln":
        import kiln
        step = kiln.compile(train_step)
    elif a.whole and a.system == "torch.compile":
        step = torch.compile(train_step)

    t0 = time.perf_counter()
    step()
    sync()
    print(f"first step {time.perf_counter() - t0:.2f} s")
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    print(f"median step {sorted(times)[5] * 1e3:.2f} ms")
    if a.host and a.system == "kiln":
        print_host_steps(step, sync, a.top)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if a.device == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(3):
            step()
        sync()
    key = a.sort or ("cuda_time_total" if a.device == "cuda" else "cpu_time_total")
    print(prof.key_averages().table(sort_by=key, row_limit=a.top, max_name_column_width=70))
    if a.kernels and a.system == "kiln" and not a.whole and a.device == "cuda":
        print_kiln_kernels(prof, model, inputs, amp, a.device, a.top, a.show_source)


def print_host_steps(step, sync, top: int) -> None:
    """Host time inside kiln's programs (kiln._C._profile_steps) against a step's wall time; the
    rest is the call path around them: guards, autograd, the optimizer, Python."""
    import kiln
    sync()
    kiln._C._profile_steps(True)
    t0 = time.perf_counter()
    for _ in range(10):
        step()
    host = (time.perf_counter() - t0) / 10
    sync()
    steps = kiln._C._profile_steps(False)
    inside = sum(s for _, s, _ in steps) / 10
    print(f"\nhost: {host * 1e3:.2f} ms a step until the last launch, {inside * 1e3:.2f} ms of it in program steps "
          f"({sum(n for _, _, n in steps) / 10:.0f} a step)")
    for label, s, n in sorted(steps, key=lambda t: -t[1])[:top]:
        print(f"  {s / 10 * 1e6:9.1f} µs  x{n / 10:<5.0f} {label}")


def print_kiln_kernels(prof, model, inputs, amp, device: str, top: int, show_source: str = "") -> None:
    """kiln's launches of 3 profiled steps named after kiln.explain's kernel lists (every kiln
    kernel is compiled as a unit named kiln_kernel), summed by name, per step."""
    import collections

    import torch
    import kiln
    with torch.autocast(device_type=device, dtype=amp or torch.float32, enabled=amp is not None):
        e = kiln.explain(model)(*inputs)
    def name(k):
        return k["name"] if isinstance(k, dict) else getattr(k, "name", k)
    names = ["fwd " + name(k) for k in e.kernels] + ["bwd " + name(k) for k in e.backward_kernels]
    if show_source:
        # forward kernels carry their source; backward ones are found in their program's
        backward_source = "".join(b.get("source", "") for b in e.backward_graphs)
        for k in e.kernels:
            if show_source in name(k):
                print(f"\n// fwd\n{k.source}")
        for n in e.backward_kernels:
            at = backward_source.find(f" {name(n)}(") if show_source in name(n) else -1
            if at >= 0:
                end = backward_source.find("\n}\n", at)
                print(f"\n// bwd\n{backward_source[backward_source.rfind(chr(10), 0, at) + 1:end + 3]}")
        for tag, text in [("forward graph", g) for g in e.graphs] + [("backward graph", b["graph"]) for b in e.backward_graphs]:
            lines = [ln for ln in text.splitlines() if show_source in ln]
            if lines:
                print(f"\n// {tag}: lines with {show_source!r}\n" + "\n".join(lines))
    events = sorted((ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda ev: ev.time_range.start)
    launches = [ev for ev in events if ev.name == "kiln_kernel"]
    print(f"\nkiln kernels: {len(launches) / 3:.0f} launches a step, explain lists {len(names)} "
          f"({len(e.kernels)} forward, {len(e.backward_kernels)} backward)")
    if len(launches) != 3 * len(names):
        names = [f"launch {i}" for i in range(len(launches) // 3)]
    by_name = collections.defaultdict(lambda: [0.0, 0])
    for i, ev in enumerate(launches):
        slot = by_name[names[i % len(names)] if names else "?"]
        slot[0] += ev.device_time / 3
        slot[1] += 1
    print(f"{sum(v[0] for v in by_name.values()):.1f} µs of kiln kernels a step")
    for n, (us, count) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {us:9.1f} µs  x{count / 3:<4.0f} {n}")


if __name__ == "__main__":
    main()
