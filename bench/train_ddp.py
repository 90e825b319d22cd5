"""Data-parallel training steps (issue 13, part 7): DistributedDataParallel over 2 ranks (NCCL on
2 GPUs, gloo on the CPU), eager vs torch.compile vs kiln, each system in processes of its own.

    python bench/train_ddp.py --device cuda --rows bert_8x128,resnet18 --out docs/x.md

Each rank trains bench/train.py's model of the row on its own batch (the row's batch per rank):
forward and loss through the compiled DDP module (`torch.compile(ddp)`, `kiln.compile(ddp)`:
DDP's forward runs as torch's, the module it wraps is compiled), `loss.backward()` (DDP's
all-reduce buckets), and torch's foreach AdamW step. "kiln-whole-backward" is kiln with
`kiln.config.optimize_ddp = False`: the backward one program, every bucket all-reduced after it;
"kiln" cuts the backward at DDP's buckets (core/autodiff/backward_stages.h) so that they overlap.

Per row and system: rank 0's first step (compile included), its median step after two warm-up
steps, and the losses of the first steps (averaged over the ranks), which must agree.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import TITLES, build, loss_of  # noqa: E402

MARK = "@@ddp@@"
SYSTEMS = ("eager", "torch.compile", "kiln-whole-backward", "kiln")
WORLD = 2


def rank_main(rank: int, row: str, system: str, device: str, steps: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    if device == "cuda":
        torch.cuda.set_device(rank)
    dev = f"cuda:{rank}" if device == "cuda" else "cpu"
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    model, inputs, loss_fn, amp = build(row, device if device == "cpu" else dev)
    # each rank its own batch: the row's inputs shifted by the rank
    inputs = tuple(torch.roll(x, shifts=rank, dims=0) for x in inputs)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank] if device == "cuda" else None)
    if system == "torch.compile":
        run = torch.compile(ddp)
    elif system.startswith("kiln"):
        import kiln
        kiln.config.optimize_ddp = system == "kiln"
        run = kiln.compile(ddp)
    else:
        run = ddp
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step():
        loss = loss_of(run, inputs, loss_fn, amp, device)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        return mean / WORLD

    losses = []
    dist.barrier()
    t0 = time.perf_counter()
    losses.append(step())
    sync()
    first = time.perf_counter() - t0
    times = []
    for i in range(2 + steps):
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        losses.append(step())
        sync()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    result = {"first_s": first, "step_ms": statistics.median(times) * 1e3, "losses": [float(l) for l in losses[:3]]}
    if system.startswith("kiln"):
        import kiln
        s = kiln.stats()
        result.update(graphs=s["graphs_compiled"], backward_graphs=s["backward_graphs_compiled"],
                      fallbacks=s["eager_fallbacks"], reasons=sorted(s["fallback_reasons"])[:3])
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


def run_system(row: str, system: str, device: str, steps: int, timeout: float) -> dict:
    env = dict(os.environ)
    env["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-ddp-")
    env["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-ddp-")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tempfile.mktemp(prefix="ddp-result-")
    cmd = [sys.executable, __file__, "--worker", row, system, "--device", device, "--steps", str(steps),
           "--port", str(port), "--result", out]
    procs = [subprocess.Popen(cmd + ["--rank", str(r)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in range(WORLD)]
    try:
        errs = [p.communicate(timeout=timeout)[1] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        return {"error": f"timed out after {timeout:.0f} s"}
    if os.path.exists(out):
        with open(out) as f:
            return json.load(f)
    lines = [line for e in errs for line in e.strip().splitlines()]
    raised = [line for line in lines if "Error" in line and not line.startswith((" ", "["))]
    return {"error": (raised or lines or ["no output"])[-1][:200]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rows", default="bert_8x128,resnet18")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=400)
    ap.add_argument("--out", default="")
    ap.add_argument("--worker", nargs=2)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--result", default="")
    a = ap.parse_args()
    if a.worker:
        rank_main(a.rank, a.worker[0], a.worker[1], a.device, a.steps, a.port, a.result)
        return
    import torch
    machine = (f"{WORLD} x {torch.cuda.get_device_name()}, NCCL" if a.device == "cuda"
               else f"{os.cpu_count()} cores, {WORLD} ranks, gloo")
    lines = [f"DDP training step (forward, loss, backward with DDP's all-reduce, AdamW), {machine}, torch "
             f"{torch.__version__}; rank 0, median of {a.steps} steps after 2 warm-up steps.", "",
             "| workload (per rank) | system | first step (s) | step (ms) | losses (first 3) | notes |",
             "|---|---|---|---|---|---|"]
    for row in a.rows.split(","):
        title = TITLES[row].format(b=16 if a.device == "cuda" else 4)
        for system in a.systems.split(","):
            r = run_system(row, system, a.device, a.steps, a.timeout)
            if "error" in r:
                lines.append(f"| {title} | {system} | | | | {r['error']} |")
            else:
                note = ""
                if system.startswith("kiln"):
                    note = (f"{r['graphs']} graphs ({r['backward_graphs']} with a backward), {r['fallbacks']} eager calls"
                            + (f": {'; '.join(r['reasons'])}" if r["reasons"] else ""))
                lines.append(f"| {title} | {system} | {r['first_s']:.2f} | {r['step_ms']:.2f} | "
                             f"{', '.join(f'{l:.4f}' for l in r['losses'])} | {note} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
