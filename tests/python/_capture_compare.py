"""The comparison behind the capture-breadth tests (test_capture_breadth.py, test_capture_numpy.py).

For one program and a maker of its inputs, ``compare_with_eager_and_dynamo``
  1. runs it eagerly on clones of fresh random inputs (inputs it mutates are compared too),
  2. runs kiln.compile(fn) on other clones and requires eager's result and eager's effect on
     the inputs, then again on new inputs,
  3. requires kiln's graph count and break count to be no larger than torch._dynamo.explain's
     on the same function and inputs, and kiln to capture something wherever Dynamo does.
Where Dynamo itself captures nothing (or fails: older torch versions do on some programs), only
the results are compared.
"""
from __future__ import annotations

import dataclasses
import math
import typing

import numpy as np
import pytest
import torch
from torch import nn

import kiln


@dataclasses.dataclass
class Case:
    fn: typing.Callable
    inputs: typing.Callable
    xfail: typing.Optional[str]
    strict: bool = True


def registry(default_inputs):
    """A dict of cases and the decorator that fills it: @case(inputs=..., xfail=...)."""
    cases: dict[str, Case] = {}

    def case(inputs=default_inputs, xfail=None, strict=True):
        # strict=False: an xfail that passes where an older torch's Dynamo captures nothing of the
        # program (then only the values are compared)
        def register(fn):
            assert fn.__name__ not in cases, fn.__name__
            cases[fn.__name__] = Case(fn, inputs, xfail, strict)
            return fn

        return register

    return cases, case


def params(cases):
    out = []
    for name, c in cases.items():
        marks = [pytest.mark.xfail(strict=c.strict, reason=c.xfail)] if c.xfail else []
        out.append(pytest.param(name, marks=marks, id=name))
    return out


def _clone(v):
    if isinstance(v, torch.Tensor):
        return v.detach().clone().requires_grad_(v.requires_grad)
    if isinstance(v, np.ndarray):
        return v.copy()
    if isinstance(v, (list, tuple)):
        return type(v)(_clone(a) for a in v)
    return v


# NumPy results: per dtype, the relative tolerance (float64 programs agree to rounding).
_NP_RTOL = {np.dtype(np.float16): 2e-3, np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-9}


def _assert_same(got, want, where="out"):
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{where}: {type(got).__name__}, eager gives a Tensor"
        torch.testing.assert_close(got, want, msg=lambda m: f"{where}: {m}")
        assert got.requires_grad == want.requires_grad, f"{where}: requires_grad {got.requires_grad}"
    elif isinstance(want, np.ndarray):
        assert type(got) is np.ndarray, f"{where}: {type(got).__name__}, eager gives an ndarray"
        assert got.dtype == want.dtype and got.shape == want.shape, (where, got.dtype, got.shape, want.dtype, want.shape)
        rtol = _NP_RTOL.get(want.dtype, 0)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol, err_msg=where)
    elif isinstance(want, np.generic):
        assert type(got) is type(want), f"{where}: {type(got).__name__}, eager gives {type(want).__name__}"
        rtol = _NP_RTOL.get(want.dtype, 0)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol, err_msg=where)
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), f"{where}: {type(got)} vs {type(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_same(g, w, f"{where}[{i}]")
    elif isinstance(want, dict):
        assert type(got) is type(want) and list(got) == list(want), f"{where}: {type(got)} {list(got)}"
        for k in want:
            _assert_same(got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, float):
        assert isinstance(got, float) and math.isclose(got, want, rel_tol=1e-6), (where, got, want)
    elif isinstance(want, (nn.Module,)) or (hasattr(want, "__dict__") and not isinstance(want, type)):
        assert type(got) is type(want), f"{where}: {type(got).__name__} vs {type(want).__name__}"
        _assert_same(dict(vars(got)), dict(vars(want)), f"{where}.__dict__")
    else:
        assert type(got) is type(want) and got == want, f"{where}: {got!r} vs eager {want!r}"


def _run(fn, args, seed=1234):
    torch.manual_seed(seed)  # cases that draw numbers (a module's init) draw the same ones
    return fn(*args)


def compare_with_eager_and_dynamo(fn, make_inputs):
    torch.manual_seed(0)
    args = make_inputs()

    # counts: kiln's against Dynamo's on the same function and inputs
    torch._dynamo.reset()
    try:
        dyn = torch._dynamo.explain(fn)(*_clone(args))
    except Exception:  # noqa: BLE001 - Dynamo itself fails on this program in this torch (older ones do)
        dyn = None
    torch._dynamo.reset()
    exp = kiln.explain(fn)(*_clone(args))
    reasons = [r["reason"] for r in exp.break_reasons]
    if dyn is not None and dyn.graph_count > 0:
        assert exp.graph_count >= 1, f"kiln runs it eagerly, Dynamo captures {dyn.graph_count} graph(s): {reasons}"
        assert exp.graph_count <= dyn.graph_count, (
            f"kiln {exp.graph_count} graphs, Dynamo {dyn.graph_count}: {reasons}")
        assert exp.graph_break_count <= max(dyn.graph_break_count, len(dyn.break_reasons)), (
            f"kiln {exp.graph_break_count} breaks, Dynamo {dyn.graph_break_count}: {reasons}")

    # values: eager's result and eager's effect on the inputs, twice
    compiled = kiln.compile(fn)
    for call in range(2):
        if call:
            torch.manual_seed(1)
            args = make_inputs()
        eager_args, kiln_args = _clone(args), _clone(args)
        want = _run(fn, eager_args)
        got = _run(compiled, kiln_args)
        _assert_same(got, want, f"call {call} result")
        _assert_same(kiln_args, eager_args, f"call {call} inputs after the call")
    if dyn is None:
        # the values were checked; the counts have nothing to be compared with
        pytest.skip(f"torch._dynamo.explain fails on this program in torch {torch.__version__}")
