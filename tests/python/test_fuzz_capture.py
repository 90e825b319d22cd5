"""Differential fuzzing of kiln's capture of Python programs in CI: a fixed set of seeds of random
Python programs around tensors (see _fuzz_capture.py) through kiln.compile against eager.

The seeds run in a child interpreter, so that a crash or hang of kiln fails the test with the
seed and program it was running. A seed fails on any difference in results (values, Python
types, nesting, identity with the caller's objects), in the caller's state or inputs after the
call, in module globals, or in raised exceptions. Re-run one with
``python bench/fuzz_capture.py --seeds SEED`` and print it with ``--show``. The point of this
test is to keep the fuzzer itself working; bench/fuzz_capture.py runs thousands of seeds.
"""
from __future__ import annotations

import _fuzz_capture as fc

SEEDS = list(range(1, 41))


def test_fuzz_capture_generator_is_deterministic_and_valid():
    a, b = fc.generate(7), fc.generate(7)
    assert a.source == b.source and a.requires_grad == b.requires_grad
    compile(a.source, "<seed 7>", "exec")
    assert "def f(x, y, state):" in a.source


def test_fuzz_capture_detects_a_difference():
    """The comparison is not vacuous: differences in values, types, nesting and identity show."""
    import torch
    out = []
    fc.compare([1, (2.0, torch.ones(2))], [1, [2.0, torch.ones(2)]], "r", out, True)
    fc.compare({"a": 1, "b": 2}, {"b": 2, "a": 1}, "r", out, True)
    fc.compare(torch.zeros(2), torch.ones(2), "r", out, True)
    t = torch.ones(1)
    fc.compare(t.clone(), t, "r", out, True, ({}, {id(t): "x"}))
    assert len(out) == 4, out


def test_fuzz_capture_seeds():
    results = fc.run_batch(SEEDS, timeout_per_seed=60.0)
    assert sorted(r.seed for r in results) == SEEDS, "the fuzzer lost seeds"
    failing = sorted((r for r in results if any(f.category not in fc.SOFT for f in r.failures)),
                     key=lambda r: r.seed)
    assert not failing, (f"{len(failing)} of {len(SEEDS)} fuzzed programs differ from eager; seeds "
                         f"{','.join(str(r.seed) for r in failing)}\n\n"
                         + "\n\n".join(fc.format_result(r, fc.SOFT) for r in failing))
    # the programs exercise what they are meant to (graph breaks, exceptions) somewhere in the set
    assert any(r.graph_breaks for r in results)
    assert any(any(r.eager_raised) for r in results)
