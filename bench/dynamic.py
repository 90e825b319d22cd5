#!/usr/bin/env python
"""Shape-generic entries against static ones (issue 11): what a symbolic size costs per call.

    python bench/dynamic.py --device cpu [--rows gelu,softmax,attention,bert] [--repeat 20]

For each row, one process times, on the same inputs:
  eager                  the function itself
  torch.compile          dynamic=False (static) and dynamic=True (symbolic sizes)
  kiln                   dynamic=False (static) and dynamic=True (symbolic sizes)
and kiln's first call of each variant (capture + compile + one run; its disk cache is empty).
The shape-generic entries are compiled on one size and timed on another, so the timed call
runs the generic kernels, not a recompile. Per-call times are medians of --repeat samples, each
long enough (about 20 ms) to hide the timer; torch.cuda.synchronize() closes every sample.

Rows:
  gelu       tanh-GELU over (B, N) float32, B*N = 16M (compiled at B=8, timed at B=16)
  softmax    softmax(x, -1) over (R, 4096) float32 (compiled at R=2048, timed at R=4096)
  attention  softmax(q @ k^T / sqrt(d)) @ v over (B, 8, T, 64) (compiled at T=256, timed at T=512)
  bert       transformers BertModel, bert-base config, random weights: batch dynamic (compiled at
             4x128, timed at 8x128; its sequence length is sliced into position ids in Python,
             which kiln specializes)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-dyn-"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-dyn-"))
os.environ.setdefault("KILN_SUPPRESS_WARNINGS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import kiln  # noqa: E402


def gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))


def softmax(x):
    return torch.softmax(x, dim=-1)


def attention(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) / (q.size(-1) ** 0.5), dim=-1) @ v


def rows(device, names):
    out = {}
    r = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    if "gelu" in names:
        n = (1 << 24) // 16 if device == "cpu" else (1 << 24) // 16
        out["gelu"] = (gelu, (r(8, n),), (r(16, n),))
    if "softmax" in names:
        rows_ = 1024 if device == "cpu" else 4096
        out["softmax"] = (softmax, (r(rows_ // 2, 4096),), (r(rows_, 4096),))
    if "attention" in names:
        b = 2 if device == "cpu" else 16
        out["attention"] = (attention, tuple(r(b, 8, 256, 64) for _ in range(3)), tuple(r(b, 8, 512, 64) for _ in range(3)))
    if "bert" in names:
        from transformers import BertConfig, BertModel
        torch.manual_seed(0)
        m = BertModel(BertConfig()).to(device).eval()
        ids = lambda b: torch.randint(0, 30000, (b, 128), device=device)  # noqa: E731
        out["bert"] = (lambda x: m(input_ids=x).last_hidden_state, (ids(4),), (ids(8),))
    return out


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def per_call(fn, args, device, repeat):
    for _ in range(3):
        fn(*args)
    sync(device)
    t0 = time.perf_counter()
    fn(*args)
    sync(device)
    one = max(time.perf_counter() - t0, 1e-6)
    n = max(1, int(0.02 / one))
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn(*args)
        sync(device)
        samples.append((time.perf_counter() - t0) / n)
    return statistics.median(samples)


def first_call(make, args, device):
    t0 = time.perf_counter()
    f = make()
    f(*args)
    sync(device)
    return f, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--rows", default="gelu,softmax,attention,bert")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--no-torch-compile", action="store_true")
    a = ap.parse_args()
    names = a.rows.split(",")
    print(f"device: {torch.cuda.get_device_name(0) if a.device == 'cuda' else 'cpu'}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    cols = ["eager", "tc static", "tc dynamic", "kiln static", "kiln dynamic", "kiln dyn/static"]
    print("| row | " + " | ".join(cols) + " | kiln 1st call static / dynamic |")
    print("|---" * (len(cols) + 2) + "|")
    with torch.no_grad():
        for name, (fn, small, big) in rows(a.device, names).items():
            res, first = {}, {}
            res["eager"] = per_call(fn, big, a.device, a.repeat)
            variants = [("kiln static", lambda: kiln.compile(fn, dynamic=False)),
                        ("kiln dynamic", lambda: kiln.compile(fn, dynamic=True))]
            if not a.no_torch_compile:
                variants += [("tc static", lambda: torch.compile(fn, dynamic=False)),
                             ("tc dynamic", lambda: torch.compile(fn, dynamic=True))]
            ref = fn(*big)
            for label, make in variants:
                kiln.reset()
                torch._dynamo.reset()
                if label.endswith("dynamic"):
                    f, first[label] = first_call(make, small, a.device)  # compiled on one size...
                else:
                    f, first[label] = first_call(make, big, a.device)
                res[label] = per_call(f, big, a.device, a.repeat)  # ...timed on another
                torch.testing.assert_close(f(*big), ref, rtol=1e-3, atol=1e-3)
                if label == "kiln dynamic":
                    s = kiln.stats()
                    assert s["eager_fallbacks"] == 0, s
                    if s["graphs_compiled"] != 1:  # a size the model reads in Python was specialized
                        print(f"# {name}: kiln dynamic=True compiled {s['graphs_compiled']} entries: "
                              f"{s['recompile_reasons'][-1]}", flush=True)
            ms = lambda k: f"{res[k] * 1e3:.3f}" if k in res else "-"  # noqa: E731
            fs = lambda k: f"{first[k]:.2f}" if k in first else "-"  # noqa: E731
            ratio = res["kiln dynamic"] / res["kiln static"]
            print(f"| {name} | {ms('eager')} | {ms('tc static')} | {ms('tc dynamic')} | {ms('kiln static')} | "
                  f"{ms('kiln dynamic')} | {ratio:.2f} | {fs('kiln static')} / {fs('kiln dynamic')} s |", flush=True)


if __name__ == "__main__":
    main()
