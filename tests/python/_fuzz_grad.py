"""Differential fuzzing of kiln's training path, the library half (bench/fuzz_grad.py is the
command line, tests/python/test_fuzz_grad.py a few fixed seeds in CI).

Each seed is _fuzz.py's random program (the one bench/fuzz.py checks for values), run on its
first input set with the floating inputs made float64 leaves that require grad: eagerly, and
through kiln.compile (a forward and a backward program). The results must agree, and so must
which results require grad and, under one random tangent per result, every input's gradient
(None where eager's is None) within float64 tolerance; a backward eager refuses (an op it cannot
differentiate) must be refused too. Programs eager rejects are skipped.
"""
from __future__ import annotations

import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import _fuzz
import kiln


def _flat(x, acc):
    """The tensors in x by position, repeats kept (_fuzz._tensors_in keeps each object once, and
    eager and kiln need not hand back the same object twice where they do)."""
    if isinstance(x, torch.Tensor):
        acc.append(x)
    elif isinstance(x, (tuple, list)):
        for v in x:
            _flat(v, acc)
    elif isinstance(x, dict):
        for v in x.values():
            _flat(v, acc)
    return acc


def _leaves(inputs):
    out = []
    for t in inputs:
        t = t.detach().clone()
        if t.is_floating_point():
            t = t.double().requires_grad_()
        out.append(t)
    return out


class _NarrowFloats(TorchDispatchMode):
    """Whether any op of a run produced a floating tensor narrower than float64."""

    def __init__(self):
        super().__init__()
        self.seen = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in _flat(out, []):
            self.seen = self.seen or (t.is_floating_point() and t.dtype != torch.float64)
        return out


def _narrow_float_work(fn, inputs) -> bool:
    mode = _NarrowFloats()
    try:
        with mode:
            fn(*_leaves(inputs))
    except Exception:  # noqa: BLE001  (eager ran it once already)
        return True
    return mode.seen


def check(seed: int):
    """None when the seed passes or does not apply, else a description of the difference;
    and whether kiln compiled a backward for it."""
    prog = _fuzz.generate(seed)
    if prog.invalid:
        return None, "invalid"
    base = _fuzz.make_inputs(prog.inputs, seed, 0)
    if not any(t.is_floating_point() for t in base):
        return None, "no floating input"
    fn = _fuzz.compile_source(prog.source)
    theirs, mine = _leaves(base), _leaves(base)
    try:
        want = fn(*theirs)
    except Exception:  # noqa: BLE001  (eager rejects it: bench/fuzz.py compares the errors)
        return None, "eager raises"
    before = kiln.stats()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            got = kiln.compile(fn)(*mine)
        except Exception as e:  # noqa: BLE001
            return f"kiln raised where eager did not: {type(e).__name__}: {e}", "raised"
    after = kiln.stats()
    kind = "compiled" if after["backward_graphs_compiled"] > before["backward_graphs_compiled"] else (
        "eager: " + next(iter(set(after["fallback_reasons"]) - set(before["fallback_reasons"])), "no backward"))
    w, g = _flat(want, []), _flat(got, [])
    if kind == "eager: no backward" and not any(t.requires_grad for t in w):
        kind = "nothing to differentiate"
    if len(w) != len(g):
        return f"{len(g)} tensors out, eager {len(w)}", kind
    for i, (a, b) in enumerate(zip(g, w)):
        if a.requires_grad != b.requires_grad:
            return f"out[{i}].requires_grad {a.requires_grad}, eager {b.requires_grad}", kind
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"out[{i}] {a.dtype}{list(a.shape)}, eager {b.dtype}{list(b.shape)}", kind
        if not torch.allclose(a.detach().double(), b.detach().double(), rtol=1e-5, atol=1e-6, equal_nan=True):
            return f"out[{i}] values differ", kind
    pairs = [(a, b) for a, b in zip(g, w) if b.requires_grad]
    if not pairs:
        return None, kind
    gen = torch.Generator().manual_seed(seed)
    tangents = [torch.randn(b.shape, generator=gen, dtype=torch.float64).to(b.dtype) for _, b in pairs]
    wrt_m = [t for t in mine if t.requires_grad]
    wrt_t = [t for t in theirs if t.requires_grad]
    try:
        gw = torch.autograd.grad([b for _, b in pairs], wrt_t, tangents, allow_unused=True)
    except Exception as e:  # noqa: BLE001  (an op eager cannot differentiate: kiln must raise too)
        gw = e
    try:
        gg = torch.autograd.grad([a for a, _ in pairs], wrt_m, tangents, allow_unused=True)
    except Exception as e:  # noqa: BLE001
        if isinstance(gw, Exception) and type(gw) is type(e):
            return None, kind
        return f"kiln's backward raised: {type(e).__name__}: {e}", kind
    if isinstance(gw, Exception):
        return f"kiln's backward ran where eager's raised {type(gw).__name__}: {gw}", kind
    narrow = None  # whether the program works in a narrower float than float64 (run once, if asked)
    for i, (a, b) in enumerate(zip(gg, gw)):
        if (a is None) != (b is None):
            return f"grad of input {i}: {'None' if a is None else 'a tensor'}, eager {'None' if b is None else 'a tensor'}", kind
        if a is None:
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"grad of input {i}: {a.dtype}{list(a.shape)}, eager {b.dtype}{list(b.shape)}", kind
        # float64 tolerances only where the program works in float64 throughout: a float64 input
        # whose gradient comes back through float32 work (softmax(a, dtype=float32)) has
        # float32's rounding, eager's included (seed 494047; 572090 with a float64 result)
        if narrow is None:
            narrow = _narrow_float_work(fn, base)
        wide = a.dtype == torch.float64 and not narrow
        tol = dict(rtol=1e-6, atol=1e-9) if wide else dict(rtol=1e-5, atol=1e-6)
        if not torch.allclose(a, b, **tol, equal_nan=True):
            err = (a - b).abs().nan_to_num(0).max().item()
            return f"grad of input {i} differs by up to {err:.3g}", kind
    return None, kind
