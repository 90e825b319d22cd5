#!/usr/bin/env python
"""Eager vs torch.compile vs kiln, in one run.

    python bench/bench.py --device cpu [--rows gelu,softmax] [--repeat 10] [--out docs/benchmarks.md]
    python bench/bench.py --device cuda --rows issue12 --tc-modes default,reduce-overhead,max-autotune \
        --kiln-modes default,reduce-overhead

Rows (float32 unless the name ends in _fp16 or _bf16: e.g. gelu_bf16, bert_1x8_fp16; the
float32 workload is built, then its floating-point inputs and its model are converted):
  sincos     torch.sin(x) + torch.cos(x), 1 element
  gelu       tanh-GELU, 16M elements (1 << 24)
  softmax    torch.softmax(x, dim=-1), 4096 x 4096
  attention  softmax(q @ k^T / sqrt(d)) @ v; CPU: (4, 8, 256, 64), GPU: (16, 8, 1024, 64)
  resnet18   torchvision resnet18 (random weights, eval), batch CPU: 4, GPU: 16 x 3 x 224 x 224;
             in fp16/bf16 the model and the input are also channels-last
  bert_1x8   Hugging Face BertModel, bert-base config (random weights, eval), batch 1 x 8 tokens
  bert_8x128 the same model, batch 8 x 128 tokens (attention mask of ones; token ids stay int64)
  numpy_fn   the seeds' NumPy function (seed 001) on two 1024 x 640 float64 arrays; CPU only, and
             "eager" is NumPy itself
--rows issue12 is the set of issue 12 (meant for --device cuda): every row above in float32, gelu,
softmax, attention and resnet18 also in bf16, the two BERT rows also in fp16 and bf16.

Modes: --tc-modes (default "default"; e.g. default,reduce-overhead,max-autotune) and --kiln-modes
(default "default"; e.g. default,reduce-overhead) compile every row once per mode, each with the
same first-call, per-call and correctness measurements. A torch.compile mode whose compile and
first call run past --tc-mode-timeout seconds (default 300) is recorded as a timeout. In the CUDA
graph modes of torch.compile on the GPU (reduce-overhead, max-autotune) every call is preceded by
torch.compiler.cudagraph_mark_step_begin(), since a replay overwrites the previous outputs. The
table gives per call and 1st call of every mode, then kiln's best per call (lowest over its modes)
over torch.compile's, and torch.compile's first call over kiln's (mode default).

What is measured, per row and mode:
  per call   median over --repeat samples after warm-up; a sample times enough back-to-back
             calls to last about 20 ms (one call for the big rows), divided by their number;
             torch.cuda.synchronize() closes every sample on the GPU.
  1st call   the first call of a freshly compiled function: capture + compile + one run, with
             empty in-memory state (torch._dynamo.reset() and inductor's in-memory kernel caches,
             kiln.reset()) and empty disk caches (TORCHINDUCTOR_CACHE_DIR and KILN_CACHE_DIR
             point at new temporary folders).
             Each worker first compiles an unrelated function once in every mode and calls
             torch's fused attention once per dtype, so these numbers leave out one-time
             process start-up (imports, compiler detection, libraries loaded lazily); the
             section "first call in a fresh process" reports that separately.
  warm       the same first call after resetting in-memory state, its disk cache kept (mode
             default only).
  kernels    len(kiln.explain(fn)(*args).kernels).

Everything runs under torch.no_grad(). Results are checked against eager with
torch.testing.assert_close (tolerances: CHECK_TOL, TF32_CONV_TOL). Each compiler runs in its own worker
process (eager and torch.compile share one), so a crash in one is recorded in the table instead of
ending the run. This file is a parent that imports neither torch nor kiln; it starts itself as the
workers.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = "@@kiln-bench "
ROW_NAMES = ("sincos", "gelu", "softmax", "attention", "resnet18", "mobilenet_v2", "vit_b_16", "bert_1x8", "bert_8x128",
             "llama_prefill", "llama_decode", "numpy_fn")
# The GPU table of issue 12 (--rows issue12).
ISSUE12_ROWS = ("sincos", "gelu", "gelu_bf16", "softmax", "softmax_bf16", "attention", "attention_bf16",
                "resnet18", "resnet18_bf16", "bert_1x8", "bert_1x8_fp16", "bert_1x8_bf16",
                "bert_8x128", "bert_8x128_fp16", "bert_8x128_bf16", "llama_prefill_bf16", "llama_decode_bf16")
ROW_SETS = {"issue12": ISSUE12_ROWS}
# Row-name suffix -> torch dtype name; no suffix is fp32.
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
# assert_close tolerances (rtol, atol) against eager, by dtype. fp32: convolution algorithms
# differ. fp16/bf16: eager rounds every intermediate to the dtype while fused kernels keep them in
# float32, so results differ by a few units in the last place (bf16: 2^-8 relative), more after
# BERT's 12 layers (torch.compile, bf16 BERT 8x128 on an H100: up to 0.094 apart, values up to 4.9).
CHECK_TOL = {"fp32": (1e-4, 1e-4), "fp16": (1e-2, 2e-2), "bf16": (5e-2, 1.5e-1)}
# float32 convolutions on the GPU: cuDNN runs them in TF32 by default (torch.backends.cudnn.
# allow_tf32), and eager and compiled code pick different algorithms, so they are TF32 rounding
# apart (torch.compile, resnet18 batch 16 on an H100: up to 8.5e-4 apart, values up to 6.1).
TF32_CONV_TOL = (2e-3, 2e-3)
CONV_ROWS = ("resnet18", "mobilenet_v2", "vit_b_16")
ROW_TITLES = {
    "sincos": "sin+cos, 1 element, {dtype}",
    "gelu": "GELU (tanh), 16M {dtype}",
    "softmax": "softmax, 4096x4096 {dtype}",
    "attention": "attention {shape} {dtype}",
    "resnet18": "torchvision resnet18, batch {batch} x 224x224, {dtype}",
    "mobilenet_v2": "torchvision mobilenet_v2, batch {batch} x 224x224, {dtype}",
    "vit_b_16": "torchvision vit_b_16, batch {batch} x 224x224, {dtype}",
    "bert_1x8": "BERT-base (transformers), batch 1 x 8 tokens, {dtype}",
    "bert_8x128": "BERT-base (transformers), batch 8 x 128 tokens, {dtype}",
    "llama_prefill": "Llama-style 8 layers, hidden 1024, prefill 1 x 128, {dtype}",
    "llama_decode": "Llama-style 8 layers, hidden 1024, one decode step (static cache), {dtype}",
    "numpy_fn": "the seeds' numpy_fn, 1024x640 float64 arrays (eager: NumPy)",
}
TC_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
KILN_MODES = ("default", "lite", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
OVERHEAD_CALLS = 2000
DEFAULT_TC_MODE_TIMEOUT = 300.0


# ----------------------------------------------------------------------------------------------
# Workloads (imported by the workers only)
# ----------------------------------------------------------------------------------------------

def sin_cos(x):
    return torch.sin(x) + torch.cos(x)


def gelu(x):
    return x * 0.5 * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))


def softmax(x):
    return torch.softmax(x, dim=-1)


def numpy_fn(X, Y):
    # The seeds' NumPy program (seed 001), as written there.
    import numpy as np

    X_mean, X_std = X.mean(axis=0), X.std(axis=0)
    Y_mean, Y_std = Y.mean(axis=0), Y.std(axis=0)
    X_std[X_std == 0] = 1
    Y_std[Y_std == 0] = 1
    X_normalized = (X - X_mean) / X_std
    Y_normalized = (Y - Y_mean) / Y_std
    intermediate_result = np.sum(X_normalized[:, :, None] * Y_normalized[:, None, :], axis=(-2, -1))
    intermediate_result = np.clip(intermediate_result, -1, 1)
    result = np.exp(intermediate_result)
    regularization_term = 0.001 * np.sum(X_normalized ** 2 + Y_normalized ** 2, axis=1)
    result += regularization_term
    return result


def attention(q, k, v):
    scores = torch.matmul(q, k.transpose(-2, -1)) / (q.size(-1) ** 0.5)
    weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights, v)


def _warmup_fn(x):
    return x * 3.0 - 1.0


def warm_up_libraries(device: str) -> None:
    """torch loads its fused attention's libraries (cuDNN's engines, flash attention) on their
    first call in a process, a hundred milliseconds and more on the GPU; both compilers call
    them for the attention rows. One small call per dtype, before any first call is timed, keeps
    that one-time start-up out of the first-call numbers of both."""
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        q = torch.randn(1, 2, 64, 64, device=device, dtype=dtype)
        torch.nn.functional.scaled_dot_product_attention(q, q, q)


def attention_shape(device: str) -> tuple:
    return (16, 8, 1024, 64) if device == "cuda" else (4, 8, 256, 64)


def resnet_batch(device: str) -> int:
    return 16 if device == "cuda" else 4  # issue 12 asks for batch 16 on the GPU


def parse_row(name: str) -> tuple:
    """'bert_1x8_fp16' -> ('bert_1x8', 'fp16'); a name without a dtype suffix is fp32."""
    base, _, suffix = name.rpartition("_")
    if suffix in DTYPES and base:
        return base, suffix
    return name, "fp32"


def channels_last(base: str, dtype: str) -> bool:
    # Convolutions in fp16/bf16 run on tensor cores in NHWC; NCHW would time layout conversions.
    return base == "resnet18" and dtype != "fp32"


def row_title(name: str, device: str) -> str:
    base, dtype = parse_row(name)
    dtype_text = DTYPES[dtype] + (" channels-last" if channels_last(base, dtype) else "")
    return ROW_TITLES[base].format(shape="x".join(map(str, attention_shape(device))),
                                   batch=resnet_batch(device), dtype=dtype_text)


def build_row(name: str, device: str):
    """The row's function (or model) and arguments, in the row's dtype."""
    base, dtype = parse_row(name)
    if base.startswith("llama_"):  # made in its dtype: a static cache takes the model's
        return llama_row(base, device, dtype)
    fn, args = build_fp32_row(base, device)
    if dtype == "fp32":
        return fn, args
    to = dict(dtype=getattr(torch, DTYPES[dtype]))
    if channels_last(base, dtype):
        to["memory_format"] = torch.channels_last
    if isinstance(fn, torch.nn.Module):
        fn = fn.to(**to)
    # Floating-point tensors only: token ids and attention masks stay int64.
    args = tuple(a.to(**to) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
    return fn, args


def build_fp32_row(base: str, device: str):
    g = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device)

    if base == "sincos":
        return sin_cos, (randn(1),)
    if base == "numpy_fn":
        import numpy as np

        rng = np.random.default_rng(0)
        return numpy_fn, (rng.standard_normal((1024, 640)), rng.standard_normal((1024, 640)))
    if base == "gelu":
        return gelu, (randn(1 << 24),)
    if base == "softmax":
        return softmax, (randn(4096, 4096),)
    if base == "attention":
        shape = attention_shape(device)
        return attention, (randn(*shape), randn(*shape), randn(*shape))
    if base in ("resnet18", "mobilenet_v2", "vit_b_16"):  # issue 14 asks for the last two at batch 4 on the CPU
        import torchvision
        torch.manual_seed(0)
        model = getattr(torchvision.models, base)().to(device).eval()
        return model, (randn(resnet_batch(device), 3, 224, 224),)
    if base.startswith("bert_"):
        import transformers
        torch.manual_seed(0)
        batch, seq = (int(n) for n in base[5:].split("x"))
        model = transformers.BertModel(transformers.BertConfig()).to(device).eval()  # bert-base sizes
        ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=g).to(device)
        mask = torch.ones(batch, seq, dtype=torch.long, device=device)
        return model, (ids, mask)
    raise ValueError(base)


def llama_row(base: str, device: str, dtype: str):
    """The Llama-style model of bench/generate.py in `dtype`, as a module returning the logits:
    a prefill of 128 tokens (no cache), or one decode step after them (a static cache filled once,
    eagerly; every call rewinds the cache's length to 128 and writes position 128 again with the
    same values, so each call computes the same logits)."""
    import transformers as T

    class LlamaStep(torch.nn.Module):
        def __init__(self, model, cache=None, pos=None):
            super().__init__()
            self.model, self.cache, self.pos = model, cache, pos

        def forward(self, ids):
            if self.cache is None:
                return self.model(input_ids=ids, use_cache=False).logits
            for layer in self.cache.layers:  # the step writes position 128 on every call
                layer.cumulative_length.copy_(self.pos[0])
            return self.model(input_ids=ids, past_key_values=self.cache, cache_position=self.pos,
                              use_cache=True).logits

    cfg = T.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                        num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=256)
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(cfg).to(device=device, dtype=getattr(torch, DTYPES[dtype])).eval()
    ids = torch.randint(1, cfg.vocab_size, (1, 128), generator=torch.Generator().manual_seed(0)).to(device)
    if base == "llama_prefill":
        return LlamaStep(model), (ids,)
    cache = T.StaticCache(config=cfg, max_cache_len=256)
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, cache_position=torch.arange(128, device=device), use_cache=True)
    return LlamaStep(model, cache, torch.tensor([128], device=device)), (ids[:, -1:],)


# ----------------------------------------------------------------------------------------------
# Worker side
# ----------------------------------------------------------------------------------------------

def emit(**kw) -> None:
    sys.stdout.write(MARK + json.dumps(kw) + "\n")
    sys.stdout.flush()


def make_sync(device: str):
    if device == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def first_call(fn, args, sync):
    sync()
    t0 = time.perf_counter()
    out = fn(*args)
    sync()
    return time.perf_counter() - t0, out


def per_call(fn, args, repeat: int, sync, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn(*args)
    sync()
    t0 = time.perf_counter()
    fn(*args)
    sync()
    est = time.perf_counter() - t0
    inner = max(1, min(100_000, int(0.02 / max(est, 1e-7))))
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn(*args)
        sync()
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples)


def overhead_us(fn, args, sync, calls: int = OVERHEAD_CALLS) -> float:
    for _ in range(20):
        fn(*args)
    sync()
    samples = []
    clock = time.perf_counter_ns
    for _ in range(calls):
        t0 = clock()
        fn(*args)
        sync()
        samples.append(clock() - t0)
    return statistics.median(samples) / 1e3


def check_tol(name: str, device: str) -> tuple:
    base, dtype = parse_row(name)
    if dtype == "fp32" and device == "cuda" and base in CONV_ROWS:
        return TF32_CONV_TOL
    return CHECK_TOL[dtype]


def check(out, ref, tol: tuple = CHECK_TOL["fp32"]) -> str | None:
    rtol, atol = tol
    try:
        torch.testing.assert_close(out, ref, rtol=rtol, atol=atol)
        return None
    except Exception as e:  # noqa: BLE001 - any mismatch is reported, not raised
        return "wrong result: " + " ".join(str(e).split())[:200]


def short_error(e: BaseException) -> str:
    return f"{type(e).__name__}: " + " ".join(str(e).split())[:200]


def fresh_dir(root: str, name: str) -> str:
    return tempfile.mkdtemp(prefix=name + "-", dir=root)


def mode_key(key: str, mode: str) -> str:
    """Result key of a mode: mode default keeps the plain key ('tc_s'), others get a suffix
    ('tc_s@reduce-overhead')."""
    return key if mode == "default" else f"{key}@{mode}"


class Timeout(BaseException):
    """Raised by the alarm. Not an Exception, so that torch's own `except Exception` handlers
    inside the compile let it through."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raises Timeout in the main thread after `seconds` (0: no limit)."""
    if not seconds:
        yield
        return

    def on_alarm(signum, frame):
        raise Timeout()
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def uses_cudagraphs(mode: str, device: str) -> bool:
    return device == "cuda" and mode in ("reduce-overhead", "max-autotune")


def tc_compile(fn, mode: str, device: str):
    compiled = torch.compile(fn, mode=mode)
    if not uses_cudagraphs(mode, device):
        return compiled

    def step(*args):
        # A CUDA graph replay overwrites the outputs of the previous one: marking the start of a
        # step (the documented way) tells torch those outputs are dead, so that back-to-back
        # calls in the timing loops neither fail nor re-record.
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(*args)
    return step


def worker_env_info(device: str) -> None:
    info = {"torch": torch.__version__, "python": platform.python_version(),
            "threads": torch.get_num_threads()}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    emit(event="env", **info)


def tc_mode_limit(timeout: float) -> float:
    """How long the parent lets one torch.compile mode of a row run before it kills the worker:
    a backstop for a hang the alarm cannot interrupt (one inside a C call). The alarm covers the
    compile and first call; the rest of the mode (the timing loops) takes far less."""
    return 2 * timeout + 60 if timeout else 0


def measure_tc(name, fn, args, ref, mode, device, repeat, sync, cache_root, timeout) -> dict:
    """torch.compile in one mode: first call (fresh caches), check, per call; in mode default
    also the first call with a warm disk cache."""
    def key(k):
        return mode_key(k, mode)
    res = {}
    try:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = fresh_dir(cache_root, f"inductor-{name}-{mode}")
        torch._dynamo.reset()
        # Inductor keeps compiled kernels in memory by source hash, which dynamo.reset() keeps:
        # without this, a later mode generating the same kernels would skip their compilation.
        torch._inductor.utils.clear_inductor_caches()
        compiled = tc_compile(fn, mode, device)
        with time_limit(timeout):
            res[key("tc_cold_s")], out = first_call(compiled, args, sync)
        bad = check(out, ref, check_tol(name, device))
        del out  # CUDA graphs: the next replay overwrites it
        if bad:
            res[key("tc_error")] = bad
        res[key("tc_s")] = per_call(compiled, args, repeat, sync)
        if mode == "default":
            torch._dynamo.reset()
            res["tc_warm_s"], _ = first_call(torch.compile(fn), args, sync)
    except Timeout:
        res[key("tc_error")] = f"timeout: compile + first call over {timeout:g} s (--tc-mode-timeout)"
    except Exception as e:  # noqa: BLE001
        res[key("tc_error")] = short_error(e)
    finally:
        torch._dynamo.reset()  # frees CUDA graph memory pools before the next mode
    return res


def worker_torch(rows, device, repeat, cache_root, modes, timeout) -> None:
    """Eager and torch.compile, one process for all rows."""
    import torch._dynamo
    import torch._inductor.utils
    worker_env_info(device)
    sync = make_sync(device)
    warm_up_libraries(device)
    for mode in modes:  # one-time start-up of every mode, outside the first-call numbers
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = fresh_dir(cache_root, f"inductor-warmup-{mode}")
        tc_compile(_warmup_fn, mode, device)(torch.ones(8, device=device))
        sync()
        torch._dynamo.reset()
    for name in rows:
        emit(event="start", row=name)
        if name == "overhead":
            fn, args = build_row("sincos", device)
            res = {"eager_us": overhead_us(fn, args, sync)}
            try:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = fresh_dir(cache_root, "inductor-overhead")
                torch._dynamo.reset()
                res["tc_us"] = overhead_us(torch.compile(fn), args, sync)
            except Exception as e:  # noqa: BLE001
                res["tc_error"] = short_error(e)
            emit(event="result", row=name, **res)
            continue
        fn, args = build_row(name, device)
        ref = fn(*args)
        res = {"eager_s": per_call(fn, args, repeat, sync)}
        for mode in modes:
            # Results so far reach the parent first, so a crash in this mode loses only this mode.
            emit(event="partial", row=name, **res)
            emit(event="start", row=name, mode=mode, limit_s=tc_mode_limit(timeout))
            res.update(measure_tc(name, fn, args, ref, mode, device, repeat, sync, cache_root, timeout))
        emit(event="result", row=name, **res)


def measure_kiln(kiln, name, fn, args, ref, mode, device, repeat, sync, cache_root) -> dict:
    """kiln in one mode: first call (fresh caches), check, per call; in mode default also the
    first call with a warm disk cache and the kernel count."""
    def key(k):
        return mode_key(k, mode)
    res = {}
    try:
        os.environ["KILN_CACHE_DIR"] = fresh_dir(cache_root, f"kiln-{name}-{mode}")
        kiln.reset()
        compiled = kiln.compile(fn, mode=mode)
        res[key("kiln_cold_s")], out = first_call(compiled, args, sync)
        st = kiln.stats()
        if st.get("eager_fallbacks"):
            reasons = "; ".join(f"{k} (x{v})" for k, v in dict(st.get("fallback_reasons", {})).items())
            res[key("kiln_fallback")] = reasons or "eager fallback"
        bad = check(out, ref, check_tol(name, device))
        del out
        if bad:
            res[key("kiln_error")] = bad
        res[key("kiln_s")] = per_call(compiled, args, repeat, sync)
        if mode == "default":
            kiln.reset()
            res["kiln_warm_s"], _ = first_call(kiln.compile(fn), args, sync)
            res["kiln_warm_disk_hits"] = kiln.stats().get("cache_hits_disk", 0)
            res.update(kiln_explain(kiln, fn, args))
    except Exception as e:  # noqa: BLE001
        res[key("kiln_error")] = short_error(e)
    return res


def worker_kiln(rows, device, repeat, cache_root, modes) -> None:
    """kiln; the parent restarts it past a row that crashes it."""
    import kiln
    emit(event="env", vector_math=kiln._C._vector_math())
    sync = make_sync(device)
    warm_up_libraries(device)
    for mode in modes:  # one-time start-up of every mode, outside the first-call numbers
        # (kiln warns here, once, about a mode it does not implement yet and compiles as default)
        os.environ["KILN_CACHE_DIR"] = fresh_dir(cache_root, f"kiln-warmup-{mode}")
        kiln.compile(_warmup_fn, mode=mode)(torch.ones(8, device=device))
        sync()
        kiln.reset()
    for name in rows:
        emit(event="start", row=name)
        if name == "overhead":
            fn, args = build_row("sincos", device)
            os.environ["KILN_CACHE_DIR"] = fresh_dir(cache_root, "kiln-overhead")
            kiln.reset()
            emit(event="result", row=name, kiln_us=overhead_us(kiln.compile(fn), args, sync))
            continue
        fn, args = build_row(name, device)
        ref = fn(*args)
        res = {}
        for mode in modes:
            emit(event="partial", row=name, **res)
            emit(event="start", row=name, mode=mode)
            res.update(measure_kiln(kiln, name, fn, args, ref, mode, device, repeat, sync, cache_root))
        emit(event="result", row=name, **res)


def kiln_explain(kiln, fn, args) -> dict:
    e = kiln.explain(fn)(*args)
    return {"kiln_kernels": len(e.kernels), "kiln_graphs": e.graph_count,
            "kiln_breaks": e.graph_break_count, "kiln_ops": e.op_count}


def worker_kiln_explain(rows, device, repeat, cache_root) -> None:
    """Only kiln.explain (compiles, runs nothing): the kernel count of a row that crashed."""
    import kiln
    os.environ["KILN_CACHE_DIR"] = fresh_dir(cache_root, "kiln-explain")
    for name in rows:
        emit(event="start", row=name)
        fn, args = build_row(name, device)
        try:
            emit(event="result", row=name, **kiln_explain(kiln, fn, args))
        except Exception as e:  # noqa: BLE001
            emit(event="result", row=name, explain_error=short_error(e))


def worker_cold_process(which, device, cache_root) -> None:
    """The very first compiled call in this process: nothing warmed up, empty disk cache."""
    sync = make_sync(device)
    fn, args = build_row("sincos", device)
    fn(*args)
    sync()
    if which == "torch":
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = fresh_dir(cache_root, "inductor-process")
        compiled = torch.compile(fn)
    else:
        os.environ["KILN_CACHE_DIR"] = fresh_dir(cache_root, "kiln-process")
        import kiln
        compiled = kiln.compile(fn)
    emit(event="start", row="process")
    t, _ = first_call(compiled, args, sync)
    res = {which + "_process_s": t}
    if which == "kiln":
        res["kiln_process_disk_hits"] = kiln.stats().get("cache_hits_disk", 0)
    emit(event="result", row="process", **res)


def split_modes(text: str) -> list:
    return [m.strip() for m in text.split(",") if m.strip()]


def run_worker(args) -> None:
    global torch
    sys.path.insert(0, REPO)
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # torch's and kiln's OpenMP alike
    import torch  # noqa: F811 - module global used by the workloads
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    rows = [r for r in args.worker_rows.split(",") if r]
    if args.worker == "torch":
        worker_torch(rows, args.device, args.repeat, args.cache_root, split_modes(args.tc_modes),
                     args.tc_mode_timeout)
    elif args.worker == "kiln":
        worker_kiln(rows, args.device, args.repeat, args.cache_root, split_modes(args.kiln_modes))
    elif args.worker == "kiln-explain":
        worker_kiln_explain(rows, args.device, args.repeat, args.cache_root)
    elif args.worker in ("cold-torch", "cold-kiln"):
        worker_cold_process(args.worker.split("-")[1], args.device, args.cache_root)


# ----------------------------------------------------------------------------------------------
# Parent side
# ----------------------------------------------------------------------------------------------

def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def worker_cmd(kind: str, rows: list, opts, cache_root: str) -> list:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--worker-rows", ",".join(rows),
           "--device", opts.device, "--repeat", str(opts.repeat), "--cache-root", cache_root,
           "--tc-modes", opts.tc_modes, "--kiln-modes", opts.kiln_modes,
           "--tc-mode-timeout", str(opts.tc_mode_timeout)]
    if opts.threads:
        cmd += ["--threads", str(opts.threads)]
    return cmd


class Watchdog:
    """Kills a worker whose current phase (a row's torch.compile mode) runs past the limit that
    the worker announced with it: the backstop for a hang the worker's own alarm cannot end."""

    def __init__(self, proc):
        self.proc, self.timer, self.fired = proc, None, None

    def arm(self, seconds: float) -> None:
        self.disarm()
        if seconds:
            self.timer = threading.Timer(seconds, self._fire, (seconds,))
            self.timer.daemon = True
            self.timer.start()

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _fire(self, seconds: float) -> None:
        self.fired = seconds
        self.proc.kill()


def exit_reason(rc: int, stderr_tail: list, watchdog: Watchdog) -> str:
    if watchdog.fired:
        return f"timeout: worker killed after {watchdog.fired:g} s in this mode (--tc-mode-timeout backstop)"
    if rc < 0:
        try:
            return f"crashed ({signal.Signals(-rc).name})"
        except ValueError:
            return f"killed by signal {-rc}"
    why = f"worker exited with status {rc}"
    if stderr_tail:
        why += ": " + stderr_tail[-1][:200]
    return why


def spawn(kind: str, rows: list, opts, cache_root: str, results: dict, env_info: dict, errors: dict):
    """Runs one worker over `rows`, restarting it past a row that kills it. Results are merged
    into results[row]; a row that kills its worker gets errors[(kind, row)], or
    errors[(kind, row, mode)] when it died in one compiler mode (the row's later modes are
    skipped; its earlier ones came as "partial" events and are kept)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    pending = list(rows)
    while pending:
        with tempfile.TemporaryFile(mode="w+") as err:
            proc = subprocess.Popen(worker_cmd(kind, pending, opts, cache_root), stdout=subprocess.PIPE,
                                    stderr=err, text=True, env=env)
            watchdog = Watchdog(proc)
            current = current_mode = None
            for line in proc.stdout:
                if not line.startswith(MARK):
                    continue
                msg = json.loads(line[len(MARK):])
                watchdog.disarm()
                if msg["event"] == "env":
                    env_info.update({k: v for k, v in msg.items() if k != "event"})
                elif msg["event"] == "start":
                    current, current_mode = msg["row"], msg.get("mode")
                    log(f"{kind}: {current}" + (f" [{current_mode}]" if current_mode else "") + " ...")
                    watchdog.arm(msg.get("limit_s", 0))
                elif msg["event"] in ("partial", "result"):
                    results.setdefault(msg["row"], {}).update(
                        {k: v for k, v in msg.items() if k not in ("event", "row")})
                    if msg["event"] == "result":
                        if msg["row"] in pending:
                            pending.remove(msg["row"])
                        current = current_mode = None
            rc = proc.wait()
            watchdog.disarm()
            if rc == 0 and not pending:
                return
            err.seek(0)
            tail = [ln.strip() for ln in err.read().splitlines() if ln.strip()]
        why = exit_reason(rc, tail, watchdog)
        failed = current if current is not None else (pending[0] if pending else None)
        log(f"{kind}: {failed or 'start-up'}" + (f" [{current_mode}]" if current_mode else "") + f": {why}")
        if failed is None:
            return
        errors[(kind, failed, current_mode) if current_mode else (kind, failed)] = why
        if current is None:  # died before reaching any row: the rest would die the same way
            for r in pending:
                errors[(kind, r)] = why
            return
        pending.remove(failed)


def fmt_time(s) -> str:
    if s is None:
        return "—"
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1.0:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def fmt_ratio(num, den) -> str:
    if not num or not den:
        return "—"
    return f"{num / den:.2f}x"


def fail_cell(why: str) -> str:
    for word in ("crashed", "wrong", "timeout"):
        if why.startswith(word):
            return word
    return "error"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def kiln_version() -> str:
    version = "?"
    try:
        with open(os.path.join(REPO, "kiln", "__init__.py")) as f:
            for line in f:
                if line.startswith("__version__"):
                    version = line.split("=", 1)[1].strip().strip("\"'")
    except OSError:
        pass
    try:
        rev = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        if rev:
            version += f" (git {rev}{', with local changes' if dirty else ''})"
    except (OSError, subprocess.SubprocessError):
        pass
    return version


def mode_label(tool: str, mode: str) -> str:
    return tool if mode == "default" else f"{tool} {mode}"


def mode_outcome(r: dict, errors: dict, kind: str, name: str, mode: str, prefix: str) -> dict:
    """One compiler mode of one row: its error (a crash of the worker, a timeout or an error the
    worker caught), eager fallback, per-call and first-call seconds."""
    def key(k):
        return mode_key(k, mode)
    return {"error": errors.get((kind, name, mode)) or errors.get((kind, name)) or r.get(key(prefix + "_error")),
            "fallback": r.get(key(prefix + "_fallback")),
            "per_call": r.get(key(prefix + "_s")), "first": r.get(key(prefix + "_cold_s"))}


def outcome_cells(o: dict) -> list:
    """[per call, 1st call] cells of a mode."""
    if o["error"]:
        per_call = fail_cell(o["error"])
    elif o["fallback"]:
        per_call = f"fallback ({fmt_time(o['per_call'])})"
    else:
        per_call = fmt_time(o["per_call"])
    return [per_call, fmt_time(o["first"])]


def valid(o: dict, key: str):
    """A time of a mode that ran right and compiled (no error, no eager fallback), else None."""
    return None if o["error"] or o["fallback"] else o[key]


def best(outcomes: list):
    times = [valid(o, "per_call") for o in outcomes if valid(o, "per_call") is not None]
    return min(times) if times else None


def render_rows(opts, rows, results, errors, notes: list) -> list:
    """The main table: eager, then per call and 1st call of every torch.compile and kiln mode,
    then the ratios, warm-cache first calls and kiln's kernel count."""
    tools = (("torch", "tc", "torch.compile", opts.tc_mode_list),
             ("kiln", "kiln", "kiln", opts.kiln_mode_list))
    head = ["workload", "eager"]
    for _, _, tool, modes in tools:
        for mode in modes:
            head += [mode_label(tool, mode), mode_label(tool, mode) + " 1st call"]
    head += ["kiln best / tc best", "tc 1st / kiln 1st", "torch.compile 1st call, warm cache",
             "kiln 1st call, warm disk cache", "kiln kernels"]
    out = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for name in rows:
        r = results.get(name, {})
        eager = r.get("eager_s")
        cells = [row_title(name, opts.device),
                 "error" if errors.get(("torch", name)) and eager is None else fmt_time(eager)]
        outcomes = {}
        for kind, prefix, tool, modes in tools:
            outcomes[kind] = {}
            for mode in modes:
                o = outcomes[kind][mode] = mode_outcome(r, errors, kind, name, mode, prefix)
                cells += outcome_cells(o)
                # A worker that died on the row outside any mode failed all its modes: one note.
                where = tool if errors.get((kind, name)) else mode_label(tool, mode)
                note = (f"**{name}, {where}: {o['error']}**" if o["error"] else
                        f"**{name}, {where}: fallback: {o['fallback']}**" if o["fallback"] else None)
                if note and note not in notes:
                    notes.append(note)
        tc, kl = outcomes["torch"], outcomes["kiln"]
        tc_first = valid(tc["default"], "first") if "default" in tc else None
        kiln_first = valid(kl["default"], "first") if "default" in kl else None
        cells += [fmt_ratio(best(list(kl.values())), best(list(tc.values()))), fmt_ratio(tc_first, kiln_first)]
        cells += [fmt_time(r.get("tc_warm_s")), kiln_warm_cell(r, kl.get("default"))]
        cells.append(kernels_cell(r))
        if r.get("explain_error"):
            notes.append(f"{name}, kiln.explain: {r['explain_error']}")
        out.append("| " + " | ".join(cells) + " |")
    return out


def kiln_warm_cell(r: dict, default) -> str:
    warm = r.get("kiln_warm_s")
    if warm is None or default is None or default["error"]:
        return "—"
    return fmt_time(warm) + ("" if r.get("kiln_warm_disk_hits") else " (no disk hit)")


def kernels_cell(r: dict) -> str:
    kernels = r.get("kiln_kernels")
    cell = "—" if kernels is None else str(kernels)
    if r.get("kiln_graphs", 1) != 1 or r.get("kiln_breaks"):
        cell += f" ({r.get('kiln_graphs')} graphs, {r.get('kiln_breaks')} breaks)"
    return cell


def bench_command(opts) -> str:
    cmd = f"python bench/bench.py --device {opts.device} --rows {opts.rows} --repeat {opts.repeat}"
    if opts.threads:
        cmd += f" --threads {opts.threads}"
    if opts.tc_modes != "default":
        cmd += f" --tc-modes {opts.tc_modes}"
    if opts.kiln_modes != "default":
        cmd += f" --kiln-modes {opts.kiln_modes}"
    if opts.tc_mode_timeout != DEFAULT_TC_MODE_TIMEOUT:
        cmd += f" --tc-mode-timeout {opts.tc_mode_timeout:g}"
    return cmd


def render(opts, rows, results, errors, env_info, started: str, load: str, elapsed: float) -> str:
    device = opts.device
    title = f"{cpu_model()}, {os.cpu_count()} cores"
    if device == "cuda":
        title += f", {env_info.get('gpu', 'GPU ?')}"
    out = [f"## {title} ({device}), {started}", ""]
    out.append(f"- torch {env_info.get('torch', '?')}, kiln {kiln_version()}, Python {env_info.get('python', '?')}")
    out.append(f"- device `{device}`; torch intra-op threads: {env_info.get('threads', '?')}; "
               f"load average at start: {load}" +
               (f"; kiln's CPU vector math: {env_info['vector_math']}" if "vector_math" in env_info else ""))
    out.append(f"- `{bench_command(opts)}` ({elapsed:.0f} s in all)")
    out.append("")
    notes = []
    out += render_rows(opts, rows, results, errors, notes)
    out.append("")
    out.append("Per call: median of the repeats. kiln best / tc best: kiln's lowest per-call time over its "
               "modes divided by torch.compile's lowest over its modes (below 1, kiln is faster). "
               "tc 1st / kiln 1st: torch.compile's first call divided by kiln's, mode default "
               "(above 1, kiln is faster). 1st call: capture, compile and one run, in-memory state reset "
               "and disk caches empty (warm cache: disk cache kept, mode default), process start-up "
               "excluded." + (" torch.compile's CUDA graph modes (reduce-overhead, max-autotune) call "
                              "torch.compiler.cudagraph_mark_step_begin() before every call."
                              if device == "cuda" else ""))
    ov = results.get("overhead")
    if ov is not None or ("torch", "overhead") in errors or ("kiln", "overhead") in errors:
        ov = ov or {}
        out += ["", f"Per-call overhead, sin+cos on 1 element (median of {OVERHEAD_CALLS} calls, each timed alone"
                + (", synchronized" if device == "cuda" else "") + "):", "",
                "| | eager | torch.compile | kiln |", "|---|---:|---:|---:|"]

        def us(key, kind):
            if errors.get((kind, "overhead")) or (key == "tc_us" and ov.get("tc_error")):
                return "error"
            v = ov.get(key)
            return "—" if v is None else f"{v:.1f} µs"
        out.append(f"| µs per call | {us('eager_us', 'torch')} | {us('tc_us', 'torch')} | {us('kiln_us', 'kiln')} |")
        for kind in ("torch", "kiln"):
            if errors.get((kind, "overhead")):
                notes.append(f"**overhead, {kind}: {errors[(kind, 'overhead')]}**")
        if ov.get("tc_error"):
            notes.append(f"**overhead, torch.compile: {ov['tc_error']}**")
    pr = results.get("process")
    if pr is not None or ("cold-torch", "process") in errors or ("cold-kiln", "process") in errors:
        pr = pr or {}

        def pcell(key, kind):
            if errors.get((kind, "process")):
                notes.append(f"**first call in a fresh process, {kind}: {errors[(kind, 'process')]}**")
                return "error"
            cell = fmt_time(pr.get(key))
            if key == "kiln_process_s" and pr.get("kiln_process_disk_hits"):
                cell += " (disk cache hit)"
            return cell
        out += ["", "First compiled call in a new process (sin+cos on 1 element; nothing compiled before in "
                "that process, empty disk caches; `import torch` / `import kiln` not counted):", "",
                "| | torch.compile | kiln |", "|---|---:|---:|",
                f"| 1st call | {pcell('torch_process_s', 'cold-torch')} | {pcell('kiln_process_s', 'cold-kiln')} |"]
    if notes:
        out += ["", "Failures:", ""] + [f"- {n}" for n in notes]
    out.append("")
    return "\n".join(out)


def expand_rows(spec: str) -> list:
    """'issue12,gelu' -> the rows of the set issue12, then gelu; each row once, in order."""
    rows = []
    for item in (r.strip() for r in spec.split(",")):
        rows += ROW_SETS.get(item, [item] if item else [])
    return list(dict.fromkeys(rows))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--rows", default=",".join(ROW_NAMES),
                    help="comma-separated rows, each of " + ", ".join(ROW_NAMES) + " with an optional "
                    "dtype suffix (_fp16, _bf16; e.g. gelu_bf16), or a named set: " + ", ".join(ROW_SETS))
    ap.add_argument("--repeat", type=int, default=10, help="timed samples per measurement (default 10)")
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads for torch and kiln (OMP_NUM_THREADS); default: torch's default")
    ap.add_argument("--tc-modes", default="default",
                    help="comma-separated torch.compile modes, of: " + ", ".join(TC_MODES) + " (default: default)")
    ap.add_argument("--kiln-modes", default="default",
                    help="comma-separated kiln.compile modes, of: " + ", ".join(KILN_MODES) + " (default: default)")
    ap.add_argument("--tc-mode-timeout", type=float, default=DEFAULT_TC_MODE_TIMEOUT,
                    help="seconds a torch.compile mode may take to compile and run a row once before it "
                    "is recorded as a timeout; 0: no limit (default %(default)g)")
    ap.add_argument("--out", help="append the results as a markdown section to this file")
    ap.add_argument("--no-overhead", action="store_true", help="skip the per-call overhead section")
    ap.add_argument("--no-process-cold", action="store_true",
                    help="skip the first-call-in-a-fresh-process section")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-rows", default="", help=argparse.SUPPRESS)
    ap.add_argument("--cache-root", help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.worker:
        run_worker(opts)
        return 0

    rows = expand_rows(opts.rows)
    unknown = [r for r in rows if parse_row(r)[0] not in ROW_NAMES]
    if unknown:
        ap.error(f"unknown rows {unknown}; choose from {', '.join(ROW_NAMES)} (optionally with a suffix "
                 f"{', '.join('_' + d for d in DTYPES)}) or a set: {', '.join(ROW_SETS)}")
    if opts.repeat < 1:
        ap.error("--repeat must be at least 1")
    if opts.tc_mode_timeout < 0:
        ap.error("--tc-mode-timeout must be 0 or more")
    opts.rows = ",".join(r.strip() for r in opts.rows.split(",") if r.strip())
    for flag, allowed in (("tc_modes", TC_MODES), ("kiln_modes", KILN_MODES)):
        modes = list(dict.fromkeys(split_modes(getattr(opts, flag))))  # in order, without repeats
        bad = [m for m in modes if m not in allowed]
        if bad or not modes:
            ap.error(f"--{flag.replace('_', '-')}: unknown or no modes {bad}; choose from {', '.join(allowed)}")
        setattr(opts, flag, ",".join(modes))
        setattr(opts, flag[:-1] + "_list", modes)  # opts.tc_mode_list, opts.kiln_mode_list

    started = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    try:
        load = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except OSError:
        load = "?"
    t0 = time.monotonic()
    cache_root = tempfile.mkdtemp(prefix="kiln-bench-")
    results, errors, env_info = {}, {}, {}
    try:
        work = rows + ([] if opts.no_overhead else ["overhead"])
        spawn("torch", work, opts, cache_root, results, env_info, errors)
        spawn("kiln", work, opts, cache_root, results, env_info, errors)
        crashed = [r for r in rows if any(k[:2] == ("kiln", r) for k in errors)
                   and "kiln_kernels" not in results.get(r, {})]
        if crashed:
            spawn("kiln-explain", crashed, opts, cache_root, results, env_info, errors)
        if not opts.no_process_cold:
            spawn("cold-torch", ["process"], opts, cache_root, results, env_info, errors)
            spawn("cold-kiln", ["process"], opts, cache_root, results, env_info, errors)
    finally:
        shutil.rmtree(cache_root, ignore_errors=True)
    elapsed = time.monotonic() - t0

    section = render(opts, rows, results, errors, env_info, started, load, elapsed)
    print(section)
    if opts.out:
        new = not os.path.exists(opts.out) or os.path.getsize(opts.out) == 0
        with open(opts.out, "a") as f:
            f.write("# kiln benchmarks\n\n" if new else "\n")
            f.write(section)
        log(f"appended to {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
