"""Training steps (issue 13): forward, loss, backward() and an AdamW step, eager vs torch.compile
vs kiln, each system in a process of its own (fresh caches, its own peak memory).

    python bench/train.py --device cuda --rows resnet18,bert_8x128,llama_bf16 --out docs/x.md

Each system compiles the whole step function (forward, loss, backward(), opt.step(),
opt.zero_grad()); eager runs torch's foreach AdamW.

Per row: the first step (capture and compile included, both passes), the median step after two
warm-up steps, and the peak memory of the steps (CUDA: torch.cuda.max_memory_allocated; CPU:
the process's peak resident set). Losses of the three systems are printed side by side: the
models start from the same weights and see the same batches, so they must agree.

Rows: resnet18 (torchvision, batch 16 at 224², cross-entropy), bert_8x128 (Hugging Face BERT-base
for sequence classification, 8 x 128 tokens), llama_bf16 (bench/bench.py's Llama-style model,
8 layers, hidden 1024, 1 x 128 tokens, language-modeling loss under torch.autocast(bfloat16)).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

MARK = "@@train@@"
SYSTEMS = ("eager", "torch.compile", "kiln")
TITLES = {
    "resnet18": "resnet18, batch {b} x 224x224, fp32",
    "bert_8x128": "BERT-base seq. classification, 8 x 128, fp32",
    "llama_bf16": "Llama-style 8 layers, hidden 1024, 1 x 128, bf16 autocast",
}


def build(row: str, device: str):
    """(model, batch, loss(out, batch) -> scalar, autocast dtype or None), seeded."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    if row == "resnet18":
        import torchvision
        b = 16 if device == "cuda" else 4
        model = torchvision.models.resnet18().to(device).train()
        x = torch.randn(b, 3, 224, 224, generator=g).to(device)
        y = torch.randint(0, 1000, (b,), generator=g).to(device)
        return model, (x,), lambda out: F.cross_entropy(out, y), None
    if row == "bert_8x128":
        import transformers as T
        cfg = T.BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # dropout: not compiled yet
        model = T.BertForSequenceClassification(cfg).to(device).train()
        ids = torch.randint(0, cfg.vocab_size, (8, 128), generator=g).to(device)
        labels = torch.randint(0, 2, (8,), generator=g).to(device)
        return model, (ids,), lambda out: F.cross_entropy(out.logits, labels), None
    if row == "llama_bf16":
        import transformers as T
        cfg = T.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                            num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=256)
        model = T.LlamaForCausalLM(cfg).to(device).train()
        ids = torch.randint(1, cfg.vocab_size, (1, 128), generator=g).to(device)
        targets = torch.randint(1, cfg.vocab_size, (1, 128), generator=g).to(device)
        return model, (ids,), lambda out: F.cross_entropy(out.logits.flatten(0, 1).float(), targets.flatten()), torch.bfloat16
    raise ValueError(row)


def loss_of(run, inputs, loss_fn, amp, device: str):
    """The row's loss of `run(*inputs)`, under autocast where the row trains in it."""
    import torch

    if amp is None:
        return loss_fn(run(*inputs))
    with torch.autocast(device_type=device, dtype=amp):
        return loss_fn(run(*inputs))


def worker(row: str, system: str, device: str, steps: int) -> None:
    import torch

    model, inputs, loss_fn, amp = build(row, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    # The whole step is what each system compiles: forward and loss (with their backward), a
    # break at backward(), then the optimizer's step and zero_grad (torch.compile: Inductor's
    # foreach kernels; kiln: its multi-tensor launches). Eager runs torch's foreach AdamW.
    def train_step():
        loss = loss_of(model, inputs, loss_fn, amp, device)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    if system == "torch.compile":
        compiled = torch.compile(train_step)
    elif system == "kiln":
        import kiln
        compiled = kiln.compile(train_step)
    else:
        compiled = train_step

    def step():
        return compiled()

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    losses = []
    t0 = time.perf_counter()
    losses.append(step())
    sync()
    first = time.perf_counter() - t0
    times = []
    for i in range(2 + steps):
        t0 = time.perf_counter()
        losses.append(step())
        sync()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated() if device == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    extra = {}
    if system == "kiln":
        import kiln
        s = kiln.stats()
        extra = {"graphs": s["graphs_compiled"], "backward_graphs": s["backward_graphs_compiled"],
                 "fallbacks": s["eager_fallbacks"], "breaks": s["graph_breaks"],
                 "reasons": sorted(s["fallback_reasons"])[:3]}
    print(MARK + json.dumps({"first_s": first, "step_ms": statistics.median(times) * 1e3, "peak_mb": peak / 2**20,
                             "losses": [float(l) for l in losses[:3]], **extra}), flush=True)


def run_worker(row, system, device, steps, timeout) -> dict:
    env = dict(os.environ)
    env["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-train-")
    env["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-train-")
    cmd = [sys.executable, __file__, "--worker", row, system, "--device", device, "--steps", str(steps)]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in p.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"error": tail[0][:160]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rows", default="resnet18,bert_8x128,llama_bf16")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--out", default="")
    ap.add_argument("--worker", nargs=2)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker[0], a.worker[1], a.device, a.steps)
        return
    import torch
    machine = torch.cuda.get_device_name() if a.device == "cuda" else f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    lines = [f"Training step (forward, loss, backward, AdamW), {machine}, torch {torch.__version__}, "
             f"median of {a.steps} steps after 2 warm-up steps.", "",
             "| workload | system | first step (s) | step (ms) | peak memory (MiB) | losses (first 3) | notes |",
             "|---|---|---|---|---|---|---|"]
    for row in a.rows.split(","):
        title = TITLES[row].format(b=16 if a.device == "cuda" else 4)
        for system in a.systems.split(","):
            r = run_worker(row, system, a.device, a.steps, a.timeout)
            if "error" in r:
                lines.append(f"| {title} | {system} | | | | | {r['error']} |")
            else:
                note = ""
                if system == "kiln":
                    note = (f"{r['graphs']} graphs ({r['backward_graphs']} with a backward), {r['breaks']} breaks, "
                            f"{r['fallbacks']} eager calls" + (f": {'; '.join(r['reasons'])}" if r["reasons"] else ""))
                lines.append(f"| {title} | {system} | {r['first_s']:.2f} | {r['step_ms']:.2f} | {r['peak_mb']:.0f} | "
                             f"{', '.join(f'{l:.4f}' for l in r['losses'])} | {note} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
