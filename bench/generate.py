#!/usr/bin/env python
"""generate() of a Llama-style model with a compiled forward (issue 11, bench (b)).

    python bench/generate.py --device cuda [--variants eager,torch,kiln,kiln-static] [--layers 8]
                             [--dtype bfloat16]

The model: transformers' LlamaForCausalLM with random weights, 8 layers, hidden 1024, 16 heads,
4 KV heads, intermediate 2816, vocabulary 32000, in --dtype (float32 by default).
Each variant greedily decodes 32 new tokens from a 16-token prompt, twice: the first call
includes every compile it triggers, the second shows the steady state. Compiling follows Hugging
Face's documented way, `model.forward = compile(model.forward)`, with the default dynamic cache
or with `cache_implementation="static"`:

  eager            model.generate as it is
  torch            torch.compile(model.forward) (default mode, dynamic cache)
  torch-static-ro  torch.compile(model.forward, mode="reduce-overhead"), static cache (GPU)
  kiln             kiln.compile(model.forward), dynamic cache
  kiln-static      kiln.compile(model.forward), static cache
  kiln-static-ro   kiln.compile(model.forward, mode="reduce-overhead"), static cache (GPU)

Every variant's tokens are compared with eager's. Caches (kiln's, inductor's) start empty.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-gen-"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-gen-"))
os.environ.setdefault("KILN_SUPPRESS_WARNINGS", "1")

import torch  # noqa: E402

import kiln  # noqa: E402


def make_model(device, layers, dtype):
    import transformers as T
    cfg = T.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=layers,
                        num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=256)
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval()
    model.generation_config.pad_token_id = 0
    return model


def timed_generate(model, prompt, device, **kw):
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    out = model.generate(prompt, **kw)
    if device == "cuda":
        torch.cuda.synchronize()
    return out, time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--variants", default="eager,torch,torch-static-ro,kiln,kiln-static,kiln-static-ro")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    device = args.device
    variants = args.variants.split(",")
    if device == "cpu":  # CUDA graphs: GPU only
        variants = [v for v in variants if not v.endswith("-ro")]
    model = make_model(device, args.layers, getattr(torch, args.dtype))
    torch.manual_seed(1)
    prompt = torch.randint(1, 32000, (1, 16), device=device)
    base = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False)
    eager_forward = model.forward
    rows, expected = [], None
    with torch.no_grad():
        for v in variants:
            kw = dict(base)
            if v.endswith("static") or v.endswith("static-ro"):
                kw["cache_implementation"] = "static"
            if v.startswith("torch"):
                torch._dynamo.reset()
                mode = "reduce-overhead" if v.endswith("-ro") else None
                model.forward = torch.compile(eager_forward, mode=mode)
            elif v.startswith("kiln"):
                kiln.reset()
                mode = "reduce-overhead" if v.endswith("-ro") else "default"
                model.forward = kiln.compile(eager_forward, mode=mode)
            else:
                model.forward = eager_forward
            before = kiln.stats()
            try:
                first, t1 = timed_generate(model, prompt, device, **kw)
                second, t2 = timed_generate(model, prompt, device, **kw)
            except Exception as e:  # a variant this torch/transformers pair cannot run
                model.forward = eager_forward
                why = str(e).strip().splitlines()[-1][:160]
                rows.append((v, float("nan"), float("nan"), False, f"failed: {type(e).__name__}: {why}"))
                print(f"{v:16s} failed: {type(e).__name__}: {why}", flush=True)
                continue
            after = kiln.stats()
            model.forward = eager_forward
            if v == "eager":
                expected = first
            same = expected is None or (torch.equal(first, expected) and torch.equal(second, expected))
            extra = ""
            if v.startswith("kiln"):
                extra = (f"{after['frames_captured'] - before['frames_captured']} entries, "
                         f"{after['eager_fallbacks'] - before['eager_fallbacks']} eager calls, "
                         f"capture {after['capture_seconds'] - before['capture_seconds']:.2f} s, "
                         f"compile {after['compile_seconds'] - before['compile_seconds']:.2f} s")
            rows.append((v, t1, t2, same, extra))
            print(f"{v:16s} first {t1:8.3f} s  second {t2:8.3f} s  tokens {'= eager' if same else 'DIFFER'}  {extra}",
                  flush=True)
    name = torch.cuda.get_device_name(0) if device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    lines = [f"generate(): Llama-style, {args.layers} layers, hidden 1024, 16 heads / 4 KV heads, {args.dtype}, "
             f"{args.new_tokens} new tokens from 16, {name}, torch {torch.__version__}", "",
             "| variant | first call (s) | second call (s) | tokens | notes |", "|---|---|---|---|---|"]
    for v, t1, t2, same, extra in rows:
        lines.append(f"| {v} | {t1:.3f} | {t2:.3f} | {'= eager' if same else 'differ'} | {extra} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
