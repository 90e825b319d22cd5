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
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if a.device == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(3):
            step()
        sync()
    key = a.sort or ("cuda_time_total" if a.device == "cuda" else "cpu_time_total")
    print(prof.key_averages().table(sort_by=key, row_limit=a.top, max_name_column_width=70))


if __name__ == "__main__":
    main()
