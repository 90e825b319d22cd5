"""Python floats that change between calls: read at each call, not recompiled per value.

torch.compile (specialize_float=False) compiles a float argument as a constant first and, once
its value changed, as a value the graph reads at each call. kiln does the same: a float whose
equality guard failed becomes a `scalar_input` of the next entry (a kernel argument), and
Python arithmetic on it (+ - *, / by a nonzero constant, unary -) stays in the graph. Anything
that reads its value as a Python object (a branch, a comparison, an op argument kiln passes as
an attribute, a return value) specializes it again: the entry is then guarded on that value.
Each test compares with eager at every value and counts the entries compiled, so a test passes
only if the float-generic entry ran (a recompile per value or a fallback fails it).
"""
import math

import pytest
import torch
import torch.nn as nn

import kiln
from _helpers import assert_same

VALUES = [0.5, 0.7, 1.3, -2.25, 3.0e-3, 1.0e6, 0.1, -0.0, 7.5, 2.0 / 3.0]


def _run(fn, make_args, *, max_graphs, values=VALUES, dynamic=None, exact=False, device="cpu"):
    kiln.reset()
    cf = kiln.compile(fn, dynamic=dynamic)
    for v in values:
        args = make_args(v, device)
        got, want = cf(*args), fn(*args)
        if exact:
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        else:
            assert_same(got, want)
    s = kiln.stats()
    assert s["eager_fallbacks"] == 0, s["fallback_reasons"]
    assert s["graphs_compiled"] <= max_graphs, s["recompile_reasons"]
    return s


def _xs(v, device="cpu"):
    return torch.randn(64, 33, device=device), v


def test_a_float_argument_that_changes_compiles_twice_then_is_read_at_each_call():
    s = _run(lambda x, s: x * s + 1, _xs, max_graphs=2)
    assert s["graphs_compiled"] == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_a_float_scale_rounds_as_eager_does_in_every_dtype(dtype):
    # eager casts the Python float to the op's compute type: bit-equal results expected
    def fn(x, s):
        return x * s, x + s, s - x, x / 4.0 * s

    _run(fn, lambda v, d: (torch.randn(257, dtype=torch.float32).to(dtype), v), max_graphs=2, exact=True)


def test_an_integer_tensor_times_a_float_is_float32_as_with_a_python_float():
    def fn(i, s):
        return i * s, (i + s).dtype == torch.float32

    s = _run(fn, lambda v, d: (torch.arange(12).view(3, 4), v), max_graphs=2)
    assert s["graphs_compiled"] == 2


def test_arithmetic_on_the_float_stays_in_the_graph():
    def fn(x, s):
        t = s * 2 - 1.5
        u = (1 - s) / 4
        return x * t + u, x * -s, x + (s + s * s)

    s = _run(fn, _xs, max_graphs=2)
    assert s["graphs_compiled"] == 2


def test_a_float_combined_with_a_symbolic_int():
    def fn(x, s):
        return x * (x.shape[0] * s)

    kiln.reset()
    cf = kiln.compile(fn)
    for n, v in [(4, 0.5), (6, 0.25), (9, 1.5), (12, 3.0), (7, -1.0)]:
        x = torch.randn(n, 3)
        assert_same(cf(x, v), fn(x, v))
    assert kiln.stats()["eager_fallbacks"] == 0
    assert kiln.stats()["graphs_compiled"] <= 3, kiln.stats()["recompile_reasons"]


def test_a_branch_on_the_float_specializes_it_and_stays_correct():
    def fn(x, s):
        if s > 1.0:
            return x * s
        return x - s

    kiln.reset()
    cf = kiln.compile(fn)
    for v in [0.5, 0.75, 2.0, 0.75, 2.0, 0.5]:
        x = torch.randn(5)
        assert_same(cf(x, v), fn(x, v))
    assert kiln.stats()["eager_fallbacks"] == 0


def test_division_by_the_float_specializes_it_and_raises_as_eager_does():
    def fn(x, s):
        return x * (1.0 / s)

    kiln.reset()
    cf = kiln.compile(fn)
    for v in [0.5, 0.25, 2.0, 4.0]:
        x = torch.randn(5)
        assert_same(cf(x, v), fn(x, v))
    with pytest.raises(ZeroDivisionError):
        cf(torch.randn(5), 0.0)


def test_a_float_argument_of_an_op_kiln_takes_as_an_attribute_is_specialized():
    def fn(x, lo):
        return torch.clamp(x, min=lo).sum() + torch.nn.functional.leaky_relu(x, lo).sum()

    kiln.reset()
    cf = kiln.compile(fn)
    for v in [0.1, 0.2, 0.1, 0.3]:
        x = torch.randn(40)
        assert_same(cf(x, v), fn(x, v))
    assert kiln.stats()["eager_fallbacks"] == 0


def test_a_returned_float_is_this_calls_value():
    def fn(x, s):
        return x * s, s * 3, -s

    kiln.reset()
    cf = kiln.compile(fn)
    for v in [0.5, 1.5, 2.5]:
        x = torch.randn(4)
        got, want = cf(x, v), fn(x, v)
        assert_same(got[0], want[0])
        assert got[1:] == want[1:]


def test_nan_and_inf_reach_the_graph_as_values():
    def fn(x, s):
        return x * s + 1.0

    kiln.reset()
    cf = kiln.compile(fn)
    for v in [0.5, 1.5, math.inf, -math.inf, math.nan, 2.0]:
        x = torch.randn(6)
        assert_same(cf(x, v), fn(x, v))
    assert kiln.stats()["graphs_compiled"] == 2, kiln.stats()["recompile_reasons"]


def test_a_module_float_attribute_that_changes():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)
            self.scale = 1.0

        def forward(self, x):
            return self.lin(x) * self.scale

    m = Scaled()
    kiln.reset()
    cm = kiln.compile(m)
    for v in [1.0, 0.5, 0.25, 0.125, 2.0]:
        m.scale = v
        x = torch.randn(3, 8)
        with torch.no_grad():
            assert_same(cm(x), m(x))
    assert kiln.stats()["graphs_compiled"] == 2, kiln.stats()["recompile_reasons"]


def test_dynamic_true_reads_float_arguments_from_the_first_call():
    s = _run(lambda x, s: torch.sigmoid(x * s), _xs, max_graphs=1, dynamic=True)
    assert s["graphs_compiled"] == 1


def test_dynamic_false_keeps_floats_constant():
    kiln.reset()
    cf = kiln.compile(lambda x, s: x * s, dynamic=False)
    for v in [0.5, 1.5, 2.5]:
        x = torch.randn(3)
        assert_same(cf(x, v), x * v)
    assert kiln.stats()["graphs_compiled"] == 3


def test_a_float_carried_across_a_graph_break():
    def fn(x, s):
        y = x * s
        print("", end="")
        return y + s

    kiln.reset()
    cf = kiln.compile(fn)
    for v in [0.5, 1.5, 2.5, 3.5, 4.5]:
        x = torch.randn(3)
        assert_same(cf(x, v), fn(x, v))
    assert kiln.stats()["eager_fallbacks"] == 0


def test_a_gradient_through_a_float_scaled_tensor():
    def fn(x, s):
        return (x * s).sin().sum()

    kiln.reset()
    cf = kiln.compile(fn)
    for v in [0.5, 1.5, 2.5, -0.5]:
        x = torch.randn(7, requires_grad=True)
        xe = x.detach().clone().requires_grad_()
        cf(x, v).backward()
        fn(xe, v).backward()
        assert_same(x.grad, xe.grad)
    assert kiln.stats()["eager_fallbacks"] == 0
    assert kiln.stats()["graphs_compiled"] <= 2, kiln.stats()["recompile_reasons"]


def test_a_float_that_is_an_int_next_time_recompiles():
    kiln.reset()
    cf = kiln.compile(lambda x, s: x * s)
    for v in [0.5, 1.5, 3, 2.5]:
        x = torch.randn(3)
        got, want = cf(x, v), x * v
        assert_same(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_float_scale_on_cuda(dtype):
    def fn(x, s):
        return torch.softmax(x * s, -1), x * (s * 0.5 + 1)

    _run(fn, lambda v, d: (torch.randn(32, 100, device=d, dtype=dtype), v), max_graphs=2, device="cuda")


def test_the_eager_backend_keeps_floats_constant():
    # its graphs run through torch's own callables, which take no per-call kernel arguments
    kiln.reset()
    cf = kiln.compile(lambda x, s: x * s + 1, backend="eager")
    for v in [0.5, 1.5, 2.5]:
        x = torch.randn(3)
        assert_same(cf(x, v), x * v + 1)
    s = kiln.stats()
    assert s["eager_fallbacks"] == 0, s["fallback_reasons"]
