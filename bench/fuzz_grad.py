"""Differential fuzzing of kiln's training path: the gradients of random programs against eager
autograd's.

    python bench/fuzz_grad.py --count 500 --seed 1
    python bench/fuzz_grad.py --seeds 17,42 --show

Each seed is tests/python/_fuzz.py's random program (the one bench/fuzz.py checks for values),
run on its first input set with the floating inputs made float64 leaves that require grad:
eagerly, and through kiln.compile (a forward and a backward program). The results must agree,
and so must which results require grad and, under one random tangent per result, every
input's gradient (None where eager's is None) within float64 tolerance. Programs eager rejects
are skipped; programs kiln runs eagerly are counted with their reasons (the gradients then are
eager's own). Runs in this process: a crash ends the run at the seed that caused it.
"""
from __future__ import annotations

import argparse
import collections
import faulthandler
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
sys.path.insert(0, ROOT)

import _fuzz  # noqa: E402
import _fuzz_grad  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seeds", help="comma-separated seeds instead of --seed/--count")
    ap.add_argument("--show", action="store_true", help="print each failing seed's program")
    a = ap.parse_args()
    faulthandler.enable()
    seeds = [int(s) for s in a.seeds.split(",")] if a.seeds else range(a.seed, a.seed + a.count)
    kinds = collections.Counter()
    failed = []
    for seed in seeds:
        print(f"seed {seed}", end="\r", file=sys.stderr, flush=True)
        problem, kind = _fuzz_grad.check(seed)
        kinds[kind.split(":")[0] if kind.startswith("eager") else kind] += 1
        if kind.startswith("eager"):
            kinds[kind[:120]] += 1
        if problem:
            failed.append(seed)
            print(f"seed {seed}: {problem}")
            if a.show:
                print(_fuzz.generate(seed).reproducer())
    print(f"\n{len(seeds)} seeds, {len(failed)} failing: {failed}")
    for k, n in kinds.most_common():
        print(f"  {n:5d}  {k}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
