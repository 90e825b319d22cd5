"""Differential fuzzing of kiln's capture of Python programs around tensors.

    python bench/fuzz_capture.py --count 2000 --seed 1
    python bench/fuzz_capture.py --seeds 137,140          # re-check given seeds
    python bench/fuzz_capture.py --seeds 137 --show       # print a seed's program (and exit)
    python bench/fuzz_capture.py --count 300 --dynamo     # graph counts against torch._dynamo.explain
    python bench/fuzz_capture.py --count 500 --backend inductor   # kiln's kernels too (floats within 1e-4)

Each seed is a random Python program around tensors (see tests/python/_fuzz_capture.py: the
generator and the checks): a function f(x, y, state) with its helpers, written to a real module
file. It runs eagerly and through kiln.compile three times (first inputs; fresh x, y with the
state the first call left; other shapes with a fresh state) and results, caller state, inputs,
module globals and exceptions are compared. Seeds run in child interpreters, `--batch` seeds to
a child, so a crash or hang is reported against its seed.

The default backend is kiln's "eager" backend (kiln's capture, guards, graph breaks and side
effects, torch's own ops), so every value must equal eager's exactly: what is fuzzed is the
capture of Python, not kernels. With --dynamo, also reports programs where kiln captured more
graphs than TorchDynamo, or none where TorchDynamo captured some (not failures by default:
--strict-dynamo makes them so). Exit status 1 if anything failed.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

import _fuzz_capture as fc  # noqa: E402


def signature(f) -> str:
    first = f.detail.strip().splitlines()[0] if f.detail.strip() else ""
    s = re.sub(r"\(at line \d+: .*?\)", "", first)
    s = re.sub(r"'[^']*'|\"[^\"]*\"", "'..'", s)
    s = re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "N", s)
    s = re.sub(r"\b(?:[tsnfbmldzohgcp]|ob|dc|nt|ts|kd)\d+_?\b", "v", s)
    s = re.sub(r"\[[^\]]*\]", "[..]", s)
    return f"{f.category}: {s[:160]}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seeds", help="comma-separated seeds (or A-B ranges) instead of --seed/--count")
    ap.add_argument("--show", action="store_true", help="print the programs of the seeds and exit")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds one program may take")
    ap.add_argument("--backend", default="eager", choices=["eager", "inductor"])
    ap.add_argument("--dynamo", action="store_true", help="compare graph counts with torch._dynamo.explain")
    ap.add_argument("--strict-dynamo", action="store_true", help="count --dynamo findings as failures")
    ap.add_argument("--ignore", default="", help="categories to leave out: " + ", ".join(sorted(fc.SHORT)))
    ap.add_argument("--quiet", action="store_true", help="only the summary")
    ap.add_argument("--json", help="write every result (one JSON object a line) to this file")
    args = ap.parse_args(argv)
    os.environ["KILN_FUZZ_BACKEND"] = args.backend
    fc.BACKEND = args.backend

    if args.seeds:
        seeds = []
        for part in args.seeds.split(","):
            if "-" in part.strip()[1:]:
                a, b = part.split("-")
                seeds += list(range(int(a), int(b) + 1))
            elif part.strip():
                seeds.append(int(part))
    else:
        seeds = list(range(args.seed, args.seed + args.count))
    if args.show:
        for s in seeds:
            print(fc.generate(s).reproducer())
            print()
        return 0
    ignore = {fc.SHORT[n.strip()] for n in args.ignore.split(",") if n.strip()}
    soft = set() if args.strict_dynamo else fc.SOFT

    batches = [seeds[i:i + args.batch] for i in range(0, len(seeds), args.batch)]
    results = []
    lock = threading.Lock()
    t0 = time.time()
    jf = open(args.json, "w") if args.json else None

    def on_result(r):
        with lock:
            results.append(r)
            if jf:
                jf.write(json.dumps(r.to_json()) + "\n")
                jf.flush()
            fails = [f for f in r.failures if f.category not in ignore]
            if fails and not args.quiet:
                print(fc.format_result(r, ignore), flush=True)
                print(flush=True)
            if len(results) % 100 == 0:
                print(f"# {len(results)}/{len(seeds)} programs, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)

    def run(batch):
        return fc.run_batch(batch, dynamo=args.dynamo, timeout_per_seed=args.timeout, on_result=on_result)

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        list(ex.map(run, batches))
    if jf:
        jf.close()
    elapsed = time.time() - t0

    by_cat = collections.defaultdict(list)
    sigs = collections.Counter()
    sig_seeds = collections.defaultdict(list)
    for r in results:
        fails = [f for f in r.failures if f.category not in ignore]
        for c in sorted({f.category for f in fails}):
            by_cat[c].append(r.seed)
        for s in sorted({signature(f) for f in fails}):
            sigs[s] += 1
            sig_seeds[s].append(r.seed)
    failing = sorted({r.seed for r in results
                      if any(f.category not in ignore and f.category not in soft for f in r.failures)})
    print("=" * 78)
    print(f"{len(results)} programs in {elapsed:.0f} s; {len(failing)} failing (backend {args.backend})")
    print("\nFailures by category (programs):")
    for c in fc.CATEGORIES:
        if c in ignore:
            continue
        s = sorted(by_cat.get(c, []))
        print(f"  {c:36s} {len(s):6d}" + (f"   seeds: {', '.join(map(str, s[:12]))}{' ...' if len(s) > 12 else ''}"
                                          if s else "") + ("  (not counted)" if c in soft and s else ""))
    if sigs:
        print("\nMost frequent failure signatures (programs):")
        for s, n in sigs.most_common(40):
            ex = ", ".join(map(str, sig_seeds[s][:8]))
            print(f"  {n:5d}  {s}\n         seeds: {ex}{' ...' if len(sig_seeds[s]) > 8 else ''}")
    eager = [r for r in results if r.ran_eagerly]
    brk = [r for r in results if r.graph_breaks]
    raised = [r for r in results if any(r.eager_raised)]
    print(f"\nPrograms raising (eagerly) on some call: {len(raised)}; with a graph break: {len(brk)}; "
          f"run whole-frame eagerly by kiln on some call: {len(eager)}")
    reasons = collections.Counter()
    for r in results:
        for k in r.fallback_reasons:
            reasons[re.sub(r"\d+", "N", k)[:140]] += 1
    if reasons:
        print("Fallback / graph-break reasons (programs):")
        for k, n in reasons.most_common(25):
            print(f"  {n:5d}  {k}")
    if args.dynamo:
        d = [r for r in results if r.dynamo_graphs >= 0 and r.kiln_graphs >= 0]
        more = sum(r.kiln_graphs > r.dynamo_graphs for r in d)
        fewer = sum(r.kiln_graphs < r.dynamo_graphs for r in d)
        print(f"\nGraph counts against TorchDynamo ({len(d)} programs): kiln more {more}, fewer {fewer}, "
              f"equal {len(d) - more - fewer}")
    if failing:
        print(f"\nFailing seeds: {','.join(map(str, failing))}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
