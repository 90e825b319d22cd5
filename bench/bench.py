#!/usr/bin/env python
"""Eager vs torch.compile vs kiln, in one run.

    python bench/bench.py --device cpu [--rows gelu,softmax] [--repeat 10] [--out docs/benchmarks.md]

Rows:
  sincos     torch.sin(x) + torch.cos(x), 1 element
  gelu       tanh-GELU, 16M float32 elements (1 << 24)
  softmax    torch.softmax(x, dim=-1), 4096 x 4096 float32
  attention  softmax(q @ k^T / sqrt(d)) @ v; CPU: (4, 8, 256, 64), GPU: (16, 8, 1024, 64)
  resnet18   torchvision resnet18 (random weights, eval), batch 4 x 3 x 224 x 224
  bert_1x8   Hugging Face BertModel, bert-base config (random weights, eval), batch 1 x 8 tokens
  bert_8x128 the same model, batch 8 x 128 tokens (attention mask of ones)

What is measured, per row:
  per call   median over --repeat samples after warm-up; a sample times enough back-to-back
             calls to last about 20 ms (one call for the big rows), divided by their number;
             torch.cuda.synchronize() closes every sample on the GPU.
  1st call   the first call of a freshly compiled function: capture + compile + one run, with
             empty in-memory state (torch._dynamo.reset(), kiln.reset()) and empty disk caches
             (TORCHINDUCTOR_CACHE_DIR and KILN_CACHE_DIR point at new temporary folders).
             Each worker first compiles an unrelated function once, so these numbers leave
             out one-time process start-up (imports, compiler detection); the section "first
             call in a fresh process" reports that separately.
  warm       the same first call after resetting in-memory state, its disk cache kept.
  kernels    len(kiln.explain(fn)(*args).kernels).

Everything runs under torch.no_grad(). Results are checked against eager with
torch.testing.assert_close. Each compiler runs in its own worker process (eager and
torch.compile share one), so a crash in one is recorded in the table instead of ending the run.
This file is a parent that imports neither torch nor kiln; it starts itself as the workers.
"""
from __future__ import annotations

import argparse
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
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = "@@kiln-bench "
ROW_NAMES = ("sincos", "gelu", "softmax", "attention", "resnet18", "bert_1x8", "bert_8x128")
ROW_TITLES = {
    "sincos": "sin+cos, 1 element",
    "gelu": "GELU (tanh), 16M float32",
    "softmax": "softmax, 4096x4096 float32",
    "attention": "attention {shape} float32",
    "resnet18": "torchvision resnet18, batch 4 x 224x224",
    "bert_1x8": "BERT-base (transformers), batch 1 x 8 tokens",
    "bert_8x128": "BERT-base (transformers), batch 8 x 128 tokens",
}
OVERHEAD_CALLS = 2000


# ----------------------------------------------------------------------------------------------
# Workloads (imported by the workers only)
# ----------------------------------------------------------------------------------------------

def sin_cos(x):
    return torch.sin(x) + torch.cos(x)


def gelu(x):
    return x * 0.5 * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))


def softmax(x):
    return torch.softmax(x, dim=-1)


def attention(q, k, v):
    scores = torch.matmul(q, k.transpose(-2, -1)) / (q.size(-1) ** 0.5)
    weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights, v)


def _warmup_fn(x):
    return x * 3.0 - 1.0


def attention_shape(device: str) -> tuple:
    return (16, 8, 1024, 64) if device == "cuda" else (4, 8, 256, 64)


def build_row(name: str, device: str):
    g = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device)

    if name == "sincos":
        return sin_cos, (randn(1),)
    if name == "gelu":
        return gelu, (randn(1 << 24),)
    if name == "softmax":
        return softmax, (randn(4096, 4096),)
    if name == "attention":
        shape = attention_shape(device)
        return attention, (randn(*shape), randn(*shape), randn(*shape))
    if name == "resnet18":
        import torchvision
        torch.manual_seed(0)
        return torchvision.models.resnet18().to(device).eval(), (randn(4, 3, 224, 224),)
    if name.startswith("bert_"):
        import transformers
        torch.manual_seed(0)
        batch, seq = (int(n) for n in name[5:].split("x"))
        model = transformers.BertModel(transformers.BertConfig()).to(device).eval()  # bert-base sizes
        ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=g).to(device)
        mask = torch.ones(batch, seq, dtype=torch.long, device=device)
        return model, (ids, mask)
    raise ValueError(name)


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


def check(out, ref) -> str | None:
    try:
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)  # convolutions: algorithms differ
        return None
    except Exception as e:  # noqa: BLE001 - any mismatch is reported, not raised
        return "wrong result: " + " ".join(str(e).split())[:200]


def short_error(e: BaseException) -> str:
    return f"{type(e).__name__}: " + " ".join(str(e).split())[:200]


def fresh_dir(root: str, name: str) -> str:
    return tempfile.mkdtemp(prefix=name + "-", dir=root)


def worker_env_info(device: str) -> None:
    info = {"torch": torch.__version__, "python": platform.python_version(),
            "threads": torch.get_num_threads()}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    emit(event="env", **info)


def worker_torch(rows, device, repeat, cache_root) -> None:
    """Eager and torch.compile, one process for all rows."""
    import torch._dynamo
    worker_env_info(device)
    sync = make_sync(device)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = fresh_dir(cache_root, "inductor-warmup")
    torch.compile(_warmup_fn)(torch.ones(8, device=device))
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
        try:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = fresh_dir(cache_root, "inductor-" + name)
            torch._dynamo.reset()
            compiled = torch.compile(fn)
            res["tc_cold_s"], out = first_call(compiled, args, sync)
            bad = check(out, ref)
            if bad:
                res["tc_error"] = bad
            res["tc_s"] = per_call(compiled, args, repeat, sync)
            torch._dynamo.reset()
            res["tc_warm_s"], _ = first_call(torch.compile(fn), args, sync)
        except Exception as e:  # noqa: BLE001
            res["tc_error"] = short_error(e)
        emit(event="result", row=name, **res)


def worker_kiln(rows, device, repeat, cache_root) -> None:
    """kiln; the parent restarts it past a row that crashes it."""
    import kiln
    sync = make_sync(device)
    os.environ["KILN_CACHE_DIR"] = fresh_dir(cache_root, "kiln-warmup")
    kiln.compile(_warmup_fn)(torch.ones(8, device=device))
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
        try:
            os.environ["KILN_CACHE_DIR"] = fresh_dir(cache_root, "kiln-" + name)
            kiln.reset()
            compiled = kiln.compile(fn)
            res["kiln_cold_s"], out = first_call(compiled, args, sync)
            st = kiln.stats()
            if st.get("eager_fallbacks"):
                reasons = "; ".join(f"{k} (x{v})" for k, v in dict(st.get("fallback_reasons", {})).items())
                res["kiln_fallback"] = reasons or "eager fallback"
            bad = check(out, ref)
            if bad:
                res["kiln_error"] = bad
            res["kiln_s"] = per_call(compiled, args, repeat, sync)
            kiln.reset()
            res["kiln_warm_s"], _ = first_call(kiln.compile(fn), args, sync)
            res["kiln_warm_disk_hits"] = kiln.stats().get("cache_hits_disk", 0)
            res.update(kiln_explain(kiln, fn, args))
        except Exception as e:  # noqa: BLE001
            res["kiln_error"] = short_error(e)
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
        worker_torch(rows, args.device, args.repeat, args.cache_root)
    elif args.worker == "kiln":
        worker_kiln(rows, args.device, args.repeat, args.cache_root)
    elif args.worker == "kiln-explain":
        worker_kiln_explain(rows, args.device, args.repeat, args.cache_root)
    elif args.worker in ("cold-torch", "cold-kiln"):
        worker_cold_process(args.worker.split("-")[1], args.device, args.cache_root)


# ----------------------------------------------------------------------------------------------
# Parent side
# ----------------------------------------------------------------------------------------------

def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def spawn(kind: str, rows: list, opts, cache_root: str, results: dict, env_info: dict, errors: dict):
    """Runs one worker over `rows`, restarting it past a row that kills it. Results are merged
    into results[row]; a row that kills its worker gets errors[(kind, row)]."""
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    pending = list(rows)
    while pending:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--worker-rows", ",".join(pending),
               "--device", opts.device, "--repeat", str(opts.repeat), "--cache-root", cache_root]
        if opts.threads:
            cmd += ["--threads", str(opts.threads)]
        with tempfile.TemporaryFile(mode="w+") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
            current = None
            for line in proc.stdout:
                if not line.startswith(MARK):
                    continue
                msg = json.loads(line[len(MARK):])
                if msg["event"] == "env":
                    env_info.update({k: v for k, v in msg.items() if k != "event"})
                elif msg["event"] == "start":
                    current = msg["row"]
                    log(f"{kind}: {current} ...")
                elif msg["event"] == "result":
                    results.setdefault(msg["row"], {}).update(
                        {k: v for k, v in msg.items() if k not in ("event", "row")})
                    if msg["row"] in pending:
                        pending.remove(msg["row"])
                    current = None
            rc = proc.wait()
            if rc == 0 and not pending:
                return
            err.seek(0)
            tail = [ln.strip() for ln in err.read().splitlines() if ln.strip()]
        if rc < 0:
            try:
                why = f"crashed ({signal.Signals(-rc).name})"
            except ValueError:
                why = f"killed by signal {-rc}"
        else:
            why = f"worker exited with status {rc}"
            if tail:
                why += ": " + tail[-1][:200]
        failed = current if current is not None else (pending[0] if pending else None)
        log(f"{kind}: {failed or 'start-up'}: {why}")
        if failed is None:
            return
        errors[(kind, failed)] = why
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
    for word in ("crashed", "wrong"):
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


def render(opts, rows, results, errors, env_info, started: str, load: str, elapsed: float) -> str:
    device = opts.device
    title = f"{cpu_model()}, {os.cpu_count()} cores"
    if device == "cuda":
        title += f", {env_info.get('gpu', 'GPU ?')}"
    out = [f"## {title} ({device}), {started}", ""]
    out.append(f"- torch {env_info.get('torch', '?')}, kiln {kiln_version()}, Python {env_info.get('python', '?')}")
    out.append(f"- device `{device}`; torch intra-op threads: {env_info.get('threads', '?')}; "
               f"load average at start: {load}")
    cmd = f"python bench/bench.py --device {device} --rows {','.join(rows)} --repeat {opts.repeat}"
    if opts.threads:
        cmd += f" --threads {opts.threads}"
    out.append(f"- `{cmd}` ({elapsed:.0f} s in all)")
    out.append("")
    out.append("| workload | eager | torch.compile | kiln | kiln vs eager | kiln vs torch.compile "
               "| torch.compile 1st call | torch.compile 1st call, warm cache | kiln 1st call "
               "| kiln 1st call, warm disk cache | kiln kernels |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    notes = []
    for name in rows:
        r = results.get(name, {})
        label = ROW_TITLES[name].format(shape="x".join(map(str, attention_shape(device))))
        tc_err = errors.get(("torch", name)) or r.get("tc_error")
        kiln_err = errors.get(("kiln", name)) or r.get("kiln_error")
        kiln_fb = r.get("kiln_fallback")
        eager = r.get("eager_s")
        tc = r.get("tc_s") if not tc_err else None
        kl = r.get("kiln_s") if not (kiln_err or kiln_fb) else None
        if errors.get(("torch", name)) and eager is None:
            eager_cell = "error"
        else:
            eager_cell = fmt_time(eager)
        tc_cell = fail_cell(tc_err) if tc_err else fmt_time(tc)
        if kiln_err:
            kiln_cell = fail_cell(kiln_err)
            notes.append(f"**{name}, kiln: {errors.get(('kiln', name)) or r.get('kiln_error')}**")
        elif kiln_fb:
            kiln_cell = f"fallback ({fmt_time(r.get('kiln_s'))})"
            notes.append(f"**{name}, kiln: fallback: {kiln_fb}**")
        else:
            kiln_cell = fmt_time(kl)
        if tc_err:
            notes.append(f"**{name}, torch.compile: {tc_err}**")
        kernels = r.get("kiln_kernels")
        kcell = "—" if kernels is None else str(kernels)
        if r.get("kiln_graphs", 1) != 1 or r.get("kiln_breaks"):
            kcell += f" ({r.get('kiln_graphs')} graphs, {r.get('kiln_breaks')} breaks)"
        if r.get("explain_error"):
            notes.append(f"{name}, kiln.explain: {r['explain_error']}")
        warm = r.get("kiln_warm_s")
        warm_cell = fmt_time(warm)
        if warm is not None and not r.get("kiln_warm_disk_hits"):
            warm_cell += " (no disk hit)"
        out.append(f"| {label} | {eager_cell} | {tc_cell} | {kiln_cell} | {fmt_ratio(eager, kl)} "
                   f"| {fmt_ratio(tc, kl)} | {fmt_time(r.get('tc_cold_s'))} | {fmt_time(r.get('tc_warm_s'))} "
                   f"| {fmt_time(r.get('kiln_cold_s') if not kiln_err else None)} "
                   f"| {fmt_time(warm if not kiln_err else None)} | {kcell} |")
    out.append("")
    out.append("Per call: median of the repeats. Ratios are speedups (eager time / kiln time, "
               "torch.compile time / kiln time): above 1, kiln is faster. 1st call: capture, compile "
               "and one run, in-memory state reset and disk caches empty (warm cache: disk cache kept), "
               "process start-up excluded.")
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--rows", default=",".join(ROW_NAMES),
                    help="comma-separated subset of: " + ", ".join(ROW_NAMES))
    ap.add_argument("--repeat", type=int, default=10, help="timed samples per measurement (default 10)")
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads for torch and kiln (OMP_NUM_THREADS); default: torch's default")
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

    rows = [r.strip() for r in opts.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in ROW_NAMES]
    if unknown:
        ap.error(f"unknown rows {unknown}; choose from {', '.join(ROW_NAMES)}")
    if opts.repeat < 1:
        ap.error("--repeat must be at least 1")

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
        crashed = [r for r in rows if ("kiln", r) in errors and "kiln_kernels" not in results.get(r, {})]
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
