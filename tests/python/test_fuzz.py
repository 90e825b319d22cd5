"""Differential fuzzing in CI: a few hundred fixed seeds of random programs (see _fuzz.py)
through kiln.compile against eager PyTorch.

The seeds run in batches, each batch in a child interpreter, so that a crash of kiln
(segfault, abort, SIGFPE) or a hang fails the batch's test with the seed and program it was
running instead of ending the session. A batch fails on any difference (values, dtype, shape,
strides, structure, exceptions) and prints each failing program's seed, source, inputs and the
difference; re-run one with ``python bench/fuzz.py --seeds SEED``. Values that eager's own
computation makes ill-conditioned at the inputs (a legitimate last-bit difference amplified past
the tolerance) are not compared: the conditioning rule, see _fuzz.Conditioning and
test_fuzz_conditioning.py.

Environment: KILN_FUZZ_IGNORE=stride,message leaves those categories out (names as
bench/fuzz.py --ignore takes them); KILN_FUZZ_NO_STRIDES=1 does not compare strides at all.
"""
from __future__ import annotations

import os

import pytest

import _fuzz

SEEDS = list(range(1, 401))
BATCH = 50
BATCHES = [SEEDS[i:i + BATCH] for i in range(0, len(SEEDS), BATCH)]


def _ignored():
    names = [x.strip() for x in os.environ.get("KILN_FUZZ_IGNORE", "").split(",") if x.strip()]
    return {_fuzz.SHORT[n] for n in names}


@pytest.mark.parametrize("seeds", BATCHES, ids=[f"seeds{b[0]}-{b[-1]}" for b in BATCHES])
def test_fuzz(seeds):
    ignore = _ignored()
    strides = not os.environ.get("KILN_FUZZ_NO_STRIDES")
    results = _fuzz.run_batch(seeds, check_strides=strides, timeout_per_seed=120.0)
    assert sorted(r.seed for r in results) == sorted(seeds), "the fuzzer lost seeds"
    failing = [r for r in results if any(f.category not in ignore for f in r.failures)]
    if failing:
        failing.sort(key=lambda r: r.seed)
        report = "\n\n".join(_fuzz.format_result(r, ignore) for r in failing)
        cats = sorted({f.category for r in failing for f in r.failures if f.category not in ignore})
        pytest.fail(f"{len(failing)} of {len(seeds)} fuzzed programs differ from eager "
                    f"({', '.join(cats)}); seeds {','.join(str(r.seed) for r in failing)}\n\n{report}",
                    pytrace=False)
