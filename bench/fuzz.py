"""Differential fuzzing of kiln against eager PyTorch, thousands of programs at a time.

    python bench/fuzz.py --count 10000 --seed 1 --jobs 1
    python bench/fuzz.py --seeds 137,140          # re-check given seeds
    python bench/fuzz.py --show 137               # print a seed's program and inputs
    python bench/fuzz.py --count 2000 --backend eager   # kiln's capture, torch's ops: exact

Each seed is a small random function (see tests/python/_fuzz.py, which holds the generator
and the checks); it runs eagerly and through kiln.compile on three input sets. Seeds run in
child interpreters, `--batch` seeds to a child, `--jobs` children at a time; a child that
crashes (segfault, abort, SIGFPE) or hangs is reported against the seed it was running.

Prints each failing seed with its program and the differences, then a summary by category
(programs per category), the most frequent failure signatures, how many programs kiln ran
(partly) eagerly, and the reach of the conditioning rule: how many programs had values left
uncompared because eager's computation of them is ill-conditioned at their inputs (a last-bit
difference that kiln may legitimately make, amplified past the tolerance: a remainder at a
multiple of its divisor, a comparison of nearly equal values, a tie of +0.0 and -0.0 in a max;
see Conditioning in tests/python/_fuzz.py), and how many of those did differ there.
`--ignore stride,message` leaves categories out of the report and the exit status;
`--no-strides` does not compare strides at all. Exit status 1 if anything failed.
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

import _fuzz  # noqa: E402


def signature(f: _fuzz.Failure) -> str:
    """A failure's detail with the numbers and names that vary between seeds taken out, to
    group failures that probably share a cause."""
    first = f.detail.strip().splitlines()[0] if f.detail.strip() else ""
    if f.category == _fuzz.CRASH:
        first = first.split("\n")[0]
    s = re.sub(r"out\[\d+\]|input [abc]( after the call)?", "<out>", first)
    s = re.sub(r"\(first inputs\)|\(fresh values\)|\(different sizes\)", "", s)
    s = re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "N", s)
    s = re.sub(r"\bt\d+\b", "tN", s)
    s = re.sub(r"\[[N, ]*\]|\([N, ]*\)", "(..)", s)
    s = re.sub(r"torch\.(float|int)N", "torch.<dtype>", s)
    return f"{f.category}: {s[:200]}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=1000, help="number of programs (default 1000)")
    ap.add_argument("--seed", type=int, default=1, help="first seed (default 1)")
    ap.add_argument("--seeds", help="comma-separated seeds to check instead of --seed/--count")
    ap.add_argument("--jobs", type=int, default=1, help="child interpreters at a time (default 1)")
    ap.add_argument("--batch", type=int, default=50, help="seeds per child interpreter (default 50)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds one program may take (default 120)")
    ap.add_argument("--no-strides", action="store_true", help="do not compare strides")
    ap.add_argument("--backend", default="inductor", choices=["inductor", "eager"],
                    help="kiln.compile's backend (default inductor; eager compares floats exactly)")
    ap.add_argument("--ignore", default="",
                    help="categories to leave out of the report, comma-separated: "
                         + ", ".join(sorted(_fuzz.SHORT)))
    ap.add_argument("--half", action="store_true", help="float16 and bfloat16 inputs and casts too")
    ap.add_argument("--quiet", action="store_true", help="print only the summary, not each failing program")
    ap.add_argument("--json", help="write every result (one JSON object a line) to this file")
    ap.add_argument("--show", help="print the programs of these comma-separated seeds and exit")
    args = ap.parse_args(argv)
    os.environ["KILN_FUZZ_BACKEND"] = args.backend  # read by _fuzz in the child interpreters
    _fuzz.BACKEND = args.backend
    if args.half:  # the generator's dtypes are fixed at import: reload with the 16-bit ones
        os.environ["KILN_FUZZ_HALF"] = "1"
        import importlib
        importlib.reload(_fuzz)
        _fuzz.BACKEND = args.backend

    if args.show:
        for s in args.show.split(","):
            print(_fuzz.generate(int(s)).reproducer())
            print()
        return 0

    ignore = set()
    for name in filter(None, (x.strip() for x in args.ignore.split(","))):
        if name not in _fuzz.SHORT:
            ap.error(f"unknown category {name!r}; one of {', '.join(sorted(_fuzz.SHORT))}")
        ignore.add(_fuzz.SHORT[name])

    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else list(range(args.seed, args.seed + args.count))
    batches = [seeds[i:i + args.batch] for i in range(0, len(seeds), args.batch)]
    results = []
    done = [0]
    t0 = time.time()
    jf = open(args.json, "w") if args.json else None
    lock = threading.Lock()  # --jobs > 1: results arrive from several threads

    def on_result(res):
        with lock:
            _record(res)

    def _record(res):
        results.append(res)
        done[0] += 1
        if jf:
            jf.write(json.dumps(res.to_json()) + "\n")
            jf.flush()
        fails = [f for f in res.failures if f.category not in ignore]
        if fails and not args.quiet:
            print(_fuzz.format_result(res, ignore), flush=True)
            print(flush=True)
        if done[0] % 100 == 0:
            print(f"# {done[0]}/{len(seeds)} programs, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)

    def run(batch):
        return _fuzz.run_batch(batch, check_strides=not args.no_strides, timeout_per_seed=args.timeout,
                               on_result=on_result)

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        list(ex.map(run, batches))
    if jf:
        jf.close()
    elapsed = time.time() - t0

    # -- summary ----------------------------------------------------------------------------
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
    failing = sorted({r.seed for r in results if any(f.category not in ignore for f in r.failures)})
    print("=" * 78)
    print(f"{len(results)} programs in {elapsed:.0f} s ({elapsed / max(1, len(results)):.2f} s each); "
          f"{len(failing)} failing" + (f" (ignoring: {', '.join(sorted(ignore))})" if ignore else ""))
    print("\nFailures by category (programs):")
    for c in _fuzz.CATEGORIES:
        if c in ignore:
            continue
        s = by_cat.get(c, [])
        print(f"  {c:34s} {len(s):6d}" + (f"   seeds: {', '.join(map(str, sorted(s)[:12]))}"
                                          f"{' ...' if len(s) > 12 else ''}" if s else ""))
    if sigs:
        print("\nMost frequent failure signatures (programs):")
        for s, n in sigs.most_common(40):
            ex = ", ".join(map(str, sig_seeds[s][:6]))
            print(f"  {n:5d}  {s}\n         seeds: {ex}{' ...' if len(sig_seeds[s]) > 6 else ''}")
    valid = [r for r in results if r.eager_raised and r.eager_raised[0] is None]
    invalid = [r for r in results if r.invalid]
    eager = [r for r in results if r.ran_eagerly]
    breaks = [r for r in results if r.graph_breaks]
    print(f"\nPrograms eager ran without error on the first inputs: {len(valid)}; "
          f"deliberately invalid: {len(invalid)}")
    print(f"Programs kiln ran (whole frame) eagerly on inputs eager accepts: {len(eager)}; "
          f"programs with a graph break: {len(breaks)}")
    reasons = collections.Counter()
    for r in results:
        for k in r.fallback_reasons:
            reasons[re.sub(r"\d+", "N", k)[:150]] += 1
    if reasons:
        print("Fallback / graph-break reasons (programs):")
        for k, n in reasons.most_common(25):
            print(f"  {n:5d}  {k}")
    # -- the conditioning rule's reach ---------------------------------------------------------
    ill = [r for r in results if r.uncompared_values]
    zonly = [r for r in results if r.uncompared_zero_signs and not r.uncompared_values]
    rescued = [r for r in results if r.uncompared_differed]
    print(f"\nConditioning rule (values ill-conditioned at their inputs are not compared): "
          f"{len(ill)} of {len(results)} programs had values left uncompared "
          f"({sum(r.uncompared_values for r in ill)} values), {len(zonly)} more only signs of zero "
          f"({sum(r.uncompared_zero_signs for r in zonly)}); kiln differed from eager there in "
          f"{len(rescued)} programs ({sum(r.uncompared_differed for r in rescued)} elements)"
          + (f": seeds {', '.join(str(r.seed) for r in rescued[:12])}{' ...' if len(rescued) > 12 else ''}"
             if rescued else ""))
    srcs = collections.Counter(s for r in ill + zonly for s in r.ill_sources)
    if srcs:
        print("Where values became ill-conditioned or signs of zero unspecified (programs):")
        for k, n in srcs.most_common(20):
            print(f"  {n:5d}  {k}")
    if failing:
        print(f"\nFailing seeds: {','.join(map(str, failing))}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
