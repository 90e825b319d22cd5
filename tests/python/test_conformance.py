"""Conformance harness in the spirit of torch's OpInfo, generated from kiln's op registry.

For every pointwise op and reduction in ``kiln._C.ops()`` whose Python spelling resolves, cases
are generated from its schema: each dtype kiln and torch share (float32, float64, float16,
bfloat16, int64, bool), empty and size-1 dims, broadcasting, non-contiguous and expanded inputs,
0-d tensors, Python scalars as operands, and for reductions dims and keepdim. Each case runs
through kiln.compile and eagerly on the same fresh random inputs: the results must agree
(values within the dtype's tolerance, dtype, shape), or both must raise the same exception type.
float16 and bfloat16 compile into kiln's 16-bit kernels (loads convert to float, stores round to
nearest even), compared with torch's OpInfo tolerances.
"""
from __future__ import annotations

import re
import zlib

import pytest
import torch

import kiln

HALF = (torch.float16, torch.bfloat16)
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.bool]
TOL = {torch.float16: (1e-3, 1e-3), torch.bfloat16: (1.6e-2, 1e-2), torch.float32: (1.3e-6, 1e-5),
       torch.float64: (1e-7, 1e-7)}
# ops whose second operand must not be zero for integer inputs (eager raises ZeroDivisionError,
# which test_ops covers on its own)
DIVIDES = {"div", "floor_divide", "remainder"}


def _resolve(path: str):
    obj = {"torch": torch, "Tensor": torch.Tensor}.get(path.split(".")[0])
    for part in path.split(".")[1:]:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _registry_ops():
    ops = []
    for op in kiln._C.ops():
        if op["kind"] not in ("pointwise", "reduction"):
            continue
        fn = next((f for f in map(_resolve, (p for p in op["python"] if p.startswith("torch."))) if f), None)
        if fn is None:
            continue
        params = re.match(r"\w+\((.*)\)", op["schema"]).group(1)
        required = [p for p in (s.strip() for s in params.split(",")) if p and p != "*" and "=" not in p]
        if not all(p.startswith("Tensor ") for p in required):
            continue  # needs a non-tensor argument the harness cannot invent (convert's dtype)
        ops.append((op["name"], op["kind"], fn, len(required)))
    return ops


OPS = _registry_ops()


def _values(shape, dtype, *, nonzero=False):
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype == torch.int64:
        v = torch.randint(-4, 5, shape)
        return torch.where(v == 0, torch.ones_like(v), v) if nonzero else v
    v = torch.randn(shape, dtype=torch.float64) * 2
    if nonzero:
        v = torch.where(v.abs() < 0.1, torch.full_like(v, 0.5), v)
    return v.to(dtype)


def _layout(kind, dtype, nonzero=False):
    """Operand tensors laid out as `kind` says (fresh values each call)."""
    if kind == "contiguous":
        return _values((3, 5), dtype, nonzero=nonzero)
    if kind == "empty":
        return _values((0, 5), dtype, nonzero=nonzero)
    if kind == "size1":
        return _values((3, 1), dtype, nonzero=nonzero)
    if kind == "transposed":
        return _values((5, 3), dtype, nonzero=nonzero).t()
    if kind == "expanded":
        return _values((1, 5), dtype, nonzero=nonzero).expand(3, 5)
    if kind == "0d":
        return _values((), dtype, nonzero=nonzero)
    raise ValueError(kind)


def _cases():
    cases = []
    for name, kind, fn, arity in OPS:
        if kind == "reduction":
            for dtype in DTYPES:
                cases.append(pytest.param(name, fn, arity, "contiguous", dtype, {}, id=f"{name}-{dtype}"))
            for kw in ({"dim": 1}, {"dim": 0, "keepdim": True}, {"dim": -1}):
                cases.append(pytest.param(name, fn, arity, "transposed", torch.float32, kw, id=f"{name}-{kw}"))
            cases.append(pytest.param(name, fn, arity, "empty", torch.float32, {"dim": 1}, id=f"{name}-empty"))
            continue
        for dtype in DTYPES:
            cases.append(pytest.param(name, fn, arity, "contiguous", dtype, {}, id=f"{name}-{dtype}"))
        for layout in ("empty", "size1", "transposed", "expanded", "0d"):
            cases.append(pytest.param(name, fn, arity, layout, torch.float32, {}, id=f"{name}-{layout}"))
        if arity == 2:
            cases.append(pytest.param(name, fn, arity, "scalar", torch.float32, {}, id=f"{name}-python-scalar"))
        for dtype in HALF:  # 16-bit kernels over strided and broadcast operands too
            for layout in ("transposed", "expanded") + (("scalar",) if arity == 2 else ()):
                cases.append(pytest.param(name, fn, arity, layout, dtype, {}, id=f"{name}-{layout}-{dtype}"))
    return cases


def _cuda_cases():
    """Every op's 16-bit cases again on the GPU (CUDA kernels read and write 16-bit buffers)."""
    marks = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
    out = []
    for p in _cases():
        name, fn, arity, layout, dtype, kwargs = p.values
        if dtype in HALF:
            out.append(pytest.param(name, fn, arity, layout, dtype, kwargs, id=p.id + "-cuda", marks=marks))
    return out


def _args(name, arity, layout, dtype):
    if layout == "scalar":
        return (_layout("contiguous", dtype), 1.5)
    if name == "where":
        return (_layout(layout, torch.bool), _layout(layout, dtype), _layout("contiguous", dtype))
    first = _layout(layout, dtype)
    if arity == 1:
        return (first,)
    # broadcasting: the second operand is a full (3, 5) tensor against size-1 and 0-d firsts
    other_layout = "contiguous" if layout in ("size1", "0d") else layout
    return (first, _layout(other_layout, dtype, nonzero=name in DIVIDES))


def _run(f, args):
    try:
        return f(*args), None
    except Exception as e:  # noqa: BLE001 - the exception is what is compared
        return None, e


@pytest.mark.parametrize("name,fn,arity,layout,dtype,kwargs", _cases())
def test_op_matches_eager(name, fn, arity, layout, dtype, kwargs):
    _compare(name, fn, arity, layout, dtype, kwargs, "cpu")


@pytest.mark.parametrize("name,fn,arity,layout,dtype,kwargs", _cuda_cases())
def test_16_bit_op_matches_eager_on_cuda(name, fn, arity, layout, dtype, kwargs):
    _compare(name, fn, arity, layout, dtype, kwargs, "cuda")


def _compare(name, fn, arity, layout, dtype, kwargs, device):
    def f(*a):
        return fn(*a, **kwargs)

    torch.manual_seed(zlib.crc32(f"{name}{layout}{dtype}{kwargs}".encode()))  # fresh values, same every run
    compiled = kiln.compile(f)
    for _ in range(2):  # the second call reuses the compiled code on new values
        args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in _args(name, arity, layout, dtype))
        expected, eager_error = _run(f, args)
        actual, kiln_error = _run(compiled, args)
        if eager_error is not None:
            assert kiln_error is not None and type(kiln_error) is type(eager_error), (
                f"eager raised {eager_error!r}, kiln gave {kiln_error!r}")
            continue
        assert kiln_error is None, f"kiln raised {kiln_error!r} where eager did not"
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        rtol, atol = TOL.get(expected.dtype, (0, 0))
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True)


def test_harness_covers_the_registry():
    names = {n for n, *_ in OPS}
    assert len(names) >= 45, sorted(names)
    assert {"add", "mul", "where", "sum", "amax", "sigmoid", "pow"} <= names
