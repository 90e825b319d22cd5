#!/usr/bin/env python
"""kiln quickstart: compile four small programs, check them against eager, time them.

    python examples/quickstart.py                  # CPU
    python examples/quickstart.py --device cuda    # GPU

For each program this prints eager and kiln time per call (median of several runs), the time
of kiln's first call (capture + compile + run; a later run of this script loads the kernels
from kiln's disk cache instead of compiling them), the number of kernels kiln generated and
where their source code was written.
"""
from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import time

import torch

import kiln


# ---- the programs ------------------------------------------------------------------------------

def sin_cos(x):
    return torch.sin(x) + torch.cos(x)


def gelu(x):
    return x * 0.5 * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))


def softmax(x):
    return torch.softmax(x, dim=-1)


class MLP(torch.nn.Module):
    def __init__(self, dim=256, hidden=1024):
        super().__init__()
        self.fc1 = torch.nn.Linear(dim, hidden)
        self.fc2 = torch.nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def make_cases(device):
    """name -> (program, example inputs)."""
    return {
        "sin+cos": (sin_cos, (torch.randn(1 << 16, device=device),)),
        "gelu": (gelu, (torch.randn(1 << 20, device=device),)),
        "softmax": (softmax, (torch.randn(1024, 1024, device=device),)),
        "mlp": (MLP().to(device).eval(), (torch.randn(128, 256, device=device),)),
    }


# ---- timing ------------------------------------------------------------------------------------

def timed(fn, args, sync):
    sync()
    t0 = time.perf_counter()
    out = fn(*args)
    sync()
    return time.perf_counter() - t0, out


def median_time(fn, args, sync, samples=7):
    """Median over several samples; each sample runs enough calls to last ~10 ms."""
    for _ in range(3):  # warm-up
        fn(*args)
    calls = max(1, int(0.01 / max(timed(fn, args, sync)[0], 1e-7)))
    results = []
    for _ in range(samples):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        sync()
        results.append((time.perf_counter() - t0) / calls)
    return statistics.median(results)


def ms(seconds):
    return f"{seconds * 1e3:8.3f} ms"


# ---- the demo ----------------------------------------------------------------------------------

def run_case(name, program, args, sync):
    compiled = kiln.compile(program)  # nn.Module in, module out; function in, function out

    disk_hits = kiln.stats()["cache_hits_disk"]
    first, out = timed(compiled, args, sync)
    how = "loaded from disk cache" if kiln.stats()["cache_hits_disk"] > disk_hits else "compiled"

    expected = program(*args)
    torch.testing.assert_close(out, expected)

    eager_t = median_time(program, args, sync)
    kiln_t = median_time(compiled, args, sync)
    report = kiln.explain(program)(*args)

    print(f"\n{name}")
    print("  result      matches eager (torch.testing.assert_close)")
    print(f"  eager       {ms(eager_t)} per call")
    print(f"  kiln        {ms(kiln_t)} per call   ({eager_t / kiln_t:.2f}x eager)")
    print(f"  first call  {ms(first)}            ({how})")
    print(f"  kernels     {len(report.kernels)}: {', '.join(k.name for k in report.kernels)}")
    if report.source_path:
        print(f"  code        {report.source_path}")
    else:  # kiln reports no path here (so far on CUDA); the source is in report.kernels[i].source
        print(f"  code        no path reported; see report.kernels[i].source, cache in {kiln.cache_dir()}")
    sys.stdout.flush()


def demo(device, names, mark=False):
    torch.manual_seed(0)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    cases = make_cases(device)
    with torch.no_grad():  # inputs that require grad under grad mode would run eagerly
        for name in names:
            if mark:  # tells supervise() which program is running
                print(f"@@case {name}", file=sys.stderr, flush=True)
            program, args = cases[name]
            run_case(name, program, args, sync)
    fallbacks = kiln.stats()["eager_fallbacks"]
    if fallbacks:
        print(f"note: {fallbacks} call(s) fell back to eager: {kiln.stats()['fallback_reasons']}")


def main():
    ap = argparse.ArgumentParser(description="kiln quickstart")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--cases", default="sin+cos,gelu,softmax,mlp", help=argparse.SUPPRESS)
    ap.add_argument("--in-process", action="store_true",
                    help="run everything in this process (a kiln crash then ends the demo)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no GPU")
    names = opts.cases.split(",")
    if opts.child:
        demo(opts.device, names, mark=True)
        return
    print(f"kiln {kiln.__version__}, torch {torch.__version__}, device {opts.device}"
          + (f" ({torch.cuda.get_device_name()})" if opts.device == "cuda" else ""))
    print(f"kiln's disk cache: {kiln.cache_dir()}")
    if opts.in_process:
        demo(opts.device, names)
    elif not supervise(opts.device, names):
        sys.exit(1)


def supervise(device, names):
    """Runs the demo in a child process so that, should kiln crash on one program, the others
    still run and the crash is reported rather than ending the demo. Returns whether all passed."""
    ok = True
    while names:
        cmd = [sys.executable, __file__, "--child", "--device", device, "--cases", ",".join(names)]
        child = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        current = None
        for line in child.stderr:
            if line.startswith("@@case "):
                current = line.split(" ", 1)[1].strip()
                names = names[names.index(current) + 1:]
            else:
                sys.stderr.write(line)
        rc = child.wait()
        if rc == 0:
            return ok
        ok = False
        if rc < 0:
            try:
                why = f"kiln crashed ({signal.Signals(-rc).name})"
            except ValueError:
                why = f"killed by signal {-rc}"
        else:
            why = f"exit status {rc}, see the error above"
        print(f"\n{current}\n  FAILED: {why}", flush=True)
        if current is None:
            sys.exit(1)
    return ok


if __name__ == "__main__":
    main()
