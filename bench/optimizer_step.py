"""The optimizer step alone (issue 13, part 5): torch.optim's foreach AdamW / SGD step over a
model's parameters with gradients in place, eager vs torch.compile vs kiln compiling
`opt.step(); opt.zero_grad(set_to_none=False)`, per-step and first-step times.

    python bench/optimizer_step.py --device cuda --model bert
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def params_of(model: str, device: str):
    if model == "bert":
        import transformers as T
        return list(T.BertModel(T.BertConfig()).to(device).parameters())
    if model == "resnet18":
        import torchvision
        return list(torchvision.models.resnet18().to(device).parameters())
    sizes = [(1024, 1024)] * 8 + [(1024,)] * 8
    return [torch.nn.Parameter(torch.randn(*s, device=device)) for s in sizes]


def run(system: str, model: str, device: str, opt_name: str, steps: int):
    torch.manual_seed(0)
    params = params_of(model, device)
    for p in params:
        p.grad = torch.randn_like(p)
    opt = (torch.optim.AdamW(params, lr=1e-3, foreach=True) if opt_name == "adamw"
           else torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=True))

    def step():
        opt.step()

    if system == "torch.compile":
        fn = torch.compile(step)
    elif system == "kiln":
        import kiln
        fn = kiln.compile(step)
    else:
        fn = step
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    fn()
    sync()
    first = time.perf_counter() - t0
    times = []
    for i in range(steps + 3):
        t0 = time.perf_counter()
        fn()
        sync()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    extra = ""
    if system == "kiln":
        import kiln
        s = kiln.stats()
        extra = f" graphs={s['graphs_compiled']} fallbacks={s['eager_fallbacks']} kernels={s['kernels_generated']}"
    print(f"| {model} {opt_name} | {system} | {statistics.median(times) * 1e3:.3f} | {first:.2f} |{extra}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", default="bert")
    ap.add_argument("--opt", default="adamw")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--systems", default="eager,torch.compile,kiln")
    a = ap.parse_args()
    print(f"| params | system | step ms | first step s |  ({a.device})")
    for system in a.systems.split(","):
        run(system, a.model, a.device, a.opt, a.steps)


if __name__ == "__main__":
    main()
