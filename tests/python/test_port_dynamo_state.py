"""State a compiled result depends on, ported from TorchDynamo's test_unspec.py, test_recompiles.py,
test_global.py, test_python_autograd.py and test_model_output.py (rewritten, not copied).

Every case compares kiln with eager on the same inputs; where a case is about capture or about
recompiles, kiln's graph / break / compile counts are compared with TorchDynamo's (kiln may have
fewer, never more). The guard cases change one piece of state a result depends on between two calls
(a global, a closure cell, a module or class attribute, os.environ, a torch flag, a default
argument) and require eager's result on the next call, never a stale one."""
import dataclasses
import enum
import functools
import importlib.util
import math
import os
import random
import sys
import tempfile
import types
import weakref

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch._dynamo
import torch._dynamo.testing

import kiln

try:
    from transformers import modeling_outputs  # noqa: F401
    from transformers.configuration_utils import PretrainedConfig
    from transformers.modeling_outputs import (
        BaseModelOutput,
        BaseModelOutputWithPastAndCrossAttentions,
        BaseModelOutputWithPoolingAndCrossAttentions,
        CausalLMOutputWithPast,
    )
    from transformers.utils import ModelOutput
    HAVE_HF = True
except ImportError:  # pragma: no cover
    HAVE_HF = False

needs_hf = pytest.mark.skipif(not HAVE_HF, reason="needs transformers")


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------

def same(a, b, path="out"):
    """Deep equality of eager's and kiln's results (types, structure and values)."""
    if isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor), f"{path}: {type(a)} is not a Tensor"
        assert a.shape == b.shape and a.dtype == b.dtype, f"{path}: {a.shape}/{a.dtype} != {b.shape}/{b.dtype}"
        torch.testing.assert_close(a, b, rtol=1.3e-6, atol=1e-5, equal_nan=True, msg=lambda m: f"{path}: {m}")
    elif isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray), f"{path}: {type(a)} is not an ndarray"
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    elif HAVE_HF and isinstance(b, ModelOutput):
        assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
        assert list(a.keys()) == list(b.keys()), f"{path}: keys {list(a.keys())} != {list(b.keys())}"
        for k in b.keys():
            same(a[k], b[k], f"{path}.{k}")
        for f in dataclasses.fields(b):
            same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(b, dict):
        assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
        assert list(a.keys()) == list(b.keys()), f"{path}: keys {list(a.keys())} != {list(b.keys())}"
        for k in b:
            same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(b, (list, tuple)):
        assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
        assert len(a) == len(b), f"{path}: len {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
    elif isinstance(b, float) and not isinstance(b, np.floating):
        assert type(a) is float, f"{path}: {type(a)} != float"
        assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9), f"{path}: {a} != {b}"
        if b == 0.0:
            assert math.copysign(1, a) == math.copysign(1, b), f"{path}: sign of zero {a} != {b}"
    elif isinstance(b, (np.generic,)):
        assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
        assert np.allclose(a, b), f"{path}: {a} != {b}"
    else:
        assert type(a) is type(b), f"{path}: {type(a)} != {type(b)} ({a!r} vs {b!r})"
        assert a == b, f"{path}: {a!r} != {b!r}"


def kiln_counts(fn, *args, **kwargs):
    e = kiln.explain(kiln.compile(fn, **kwargs))(*args)
    return e.graph_count, e.graph_break_count


def dynamo_counts(fn, *args):
    torch._dynamo.reset()
    r = torch._dynamo.explain(fn)(*args)
    torch._dynamo.reset()
    return r.graph_count, r.graph_break_count


def not_more_than_dynamo(fn, make_args, **kwargs):
    """kiln's graph and break counts on fn are no more than TorchDynamo's (args made afresh for each)."""
    kg, kb = kiln_counts(fn, *make_args(), **kwargs)
    dg, db = dynamo_counts(fn, *make_args())
    assert kg <= dg and kb <= db, f"kiln {kg} graphs / {kb} breaks, TorchDynamo {dg} / {db}"
    return kg, kb


def compiles(fn, calls, **kwargs):
    """Run kiln.compile(fn) over calls (arg tuples); every result must equal eager's.
    Returns how many graphs kiln compiled."""
    kiln.reset()
    c = kiln.compile(fn, **kwargs)
    for args in calls:
        same(c(*args), fn(*args))
    return kiln.stats()["graphs_compiled"]


def dynamo_frames(fn, calls, **kwargs):
    torch._dynamo.reset()
    cnt = torch._dynamo.testing.CompileCounter()
    opt = torch.compile(fn, backend=cnt, **kwargs)
    for args in calls:
        opt(*args)
    torch._dynamo.reset()
    return cnt.frame_count


def compiles_not_more(fn, calls, **kwargs):
    k = compiles(fn, calls, **kwargs)
    d = dynamo_frames(fn, calls, **kwargs)
    assert k <= d, f"kiln compiled {k} graphs, TorchDynamo {d}"
    return k, d


def both(fn, *args, **kwargs):
    """(kiln's result, eager's result) on copies of the same arguments."""
    got = kiln.compile(fn, **kwargs)(*args)
    return got, fn(*args)


# ==============================================================================================
# 1. test_unspec.py: Python numbers as arguments, random, item()
# ==============================================================================================

def test_unspec_numpy_correctness():
    def fn(x, y, z):
        xy = [x + y, y, False]
        np_x = x.numpy()
        np_y = y.numpy()
        return {"x": x, "z": z, "a": np_y.sum(), "b": xy, "c": np_y[0][0] / 68, "d": np_x.sum(),
                "e": np_x + np_y}, x + np_y.sum() + z

    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    y = torch.ones([2, 2], dtype=torch.int64)
    z = np.int64(12)
    got, want = both(fn, x, y, z)
    same(got, want)


@pytest.mark.xfail(strict=True, reason='np.int64 arguments are guarded by value (EQUALS_MATCH): 8 entries then the cache limit and eager; TorchDynamo: 1 graph')
def test_unspec_numpy_int_values_do_not_recompile_more_than_dynamo():
    def fn(x, y):
        return {"a": x + 1, "b": y / 2}

    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    compiles_not_more(fn, [(x, np.int64(i)) for i in range(10)])


def test_unspec_builtin_max_min_of_numpy_and_python_ints():
    def fn(x, y, z):
        return z + 1, max(x, y), min(x - 4, y)

    z = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    got, want = both(fn, np.int64(12), 10, z)
    same(got[0], want[0])
    assert got[1] == want[1] and got[2] == want[2]


def test_unspec_random_values_fed_into_graph():
    def fn(shape):
        torch.manual_seed(123)
        return torch.ones(shape) * random.randint(30, 100), torch.randn(shape)

    c = kiln.compile(fn)
    random.seed(1)
    want = fn([2, 3])
    random.seed(1)
    got = c([2, 3])
    same(got[0], want[0])
    # torch.randn in a kiln kernel draws from kiln's own counter-based generator (documented in
    # test_random_draws.py): reproducible under torch.manual_seed, not eager's values
    random.seed(1)
    same(c([2, 3]), got)
    assert random.random() == (random.seed(1), random.randint(30, 100), random.random())[2]


@pytest.mark.xfail(strict=True, reason="backend='eager' draws torch.rand from kiln's own generator: not "
                   "eager's values, and torch's generator is left elsewhere (README: 'eager's exact results')")
def test_backend_eager_torch_rand_is_eagers():
    def fn(x):
        return x + torch.rand(3)

    c = kiln.compile(fn, backend="eager")
    x = torch.zeros(3)
    torch.manual_seed(1)
    want = fn(x)
    after_eager = torch.rand(2)
    torch.manual_seed(1)
    got = c(x)
    same(torch.rand(2), after_eager)
    same(got, want)


def test_unspec_random_values_with_graph_break():
    def fn(x):
        r1 = random.random()
        y = x + random.uniform(10, 20)
        y.sum().item()
        r2 = random.randint(2, 18)
        y.sum().item()
        return y + r1, r2

    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    c = kiln.compile(fn)
    for seed in (1, 2):
        random.seed(seed)
        want = fn(x)
        after_eager = random.random()
        random.seed(seed)
        got = c(x)
        same(got, want)
        assert random.random() == after_eager  # the generator is left where eager leaves it


def test_unspec_consecutive_random_calls_before_graph():
    def fn(x):
        d1 = random.randrange(start=0, stop=5)
        d2 = random.randrange(start=0, stop=5)
        d3 = random.randrange(start=0, stop=5)
        return x + 2, torch.rand(d1, d2, d3).shape

    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    c = kiln.compile(fn)
    for seed in (1, 5, 9):
        random.seed(seed)
        want = fn(x)
        random.seed(seed)
        got = c(x)
        same(got, want)


@pytest.mark.xfail(strict=True, reason="random.uniform/random.random/random.randint are graph breaks ('bound method random.Random.uniform with no known source'); TorchDynamo captures them, fullgraph=True passes there")
def test_unspec_compiled_random_calls_are_random():
    def fn(x):
        return (x + 1) * random.uniform(0, 1)

    c = kiln.compile(fn, fullgraph=True)
    res = [c(torch.ones(2)) for _ in range(5)]
    for a, b in zip(res, res[1:]):
        assert not torch.equal(a, b)
    random.seed(7)
    want = fn(torch.ones(2))
    random.seed(7)
    same(c(torch.ones(2)), want)


def test_unspec_random_call_in_while_loop():
    def fn(x):
        d1 = random.randrange(start=0, stop=3)
        d2 = d1
        while d1 == d2:
            d2 = random.randrange(start=0, stop=3)
        return x * d2

    x = torch.randn(4)
    c = kiln.compile(fn)
    for seed in (1, 10, 3):
        random.seed(seed)
        want = fn(x)
        random.seed(seed)
        same(c(x), want)


def test_unspec_random_random_python_float_result():
    def fn(x):
        r = random.random()
        return x * r, r

    c = kiln.compile(fn)
    for seed in (0, 1, 2):
        random.seed(seed)
        want = fn(torch.ones(3))
        random.seed(seed)
        same(c(torch.ones(3)), want)


def test_unspec_builtin_getitem_with_int_index():
    def fn(x, idx):
        return torch.zeros(idx), x[idx], x[idx:]

    x = list(range(50))
    c = kiln.compile(fn)
    for i in (48, 47, 12):
        same(c(x, i), fn(x, i))


def test_unspec_use_and_specialize_dynamic():
    def fn(x, y):
        x = x + y
        if y == 2:
            return x - 1
        return x + 1

    calls = [(torch.tensor([5]), 2), (torch.tensor([6]), 2), (torch.tensor([5]), 3), (torch.tensor([4]), 3)]
    k, d = compiles_not_more(fn, calls, dynamic=True, fullgraph=True)


def test_unspec_ints_do_not_recompile_with_dynamic_true():
    def fn(x, y):
        return x + y

    calls = [(torch.tensor([5]), 100), (torch.tensor([4]), 200), (torch.tensor([3]), 300), (torch.tensor([2]), 400)]
    k, d = compiles_not_more(fn, calls, dynamic=True, fullgraph=True)
    assert k == 1


def test_unspec_prod_backward_over_shapes():
    def fn(t):
        return torch.prod(t, 3, keepdim=True)

    c = kiln.compile(fn, dynamic=True)
    kiln.reset()
    for s in [(8, 10, 3, 2), (8, 3, 5, 2), (8, 4, 8, 2)]:
        t1 = torch.randn(s, requires_grad=True)
        t2 = t1.detach().clone().requires_grad_(True)
        r1 = c(t1)
        r2 = fn(t2)
        same(r1.detach(), r2.detach())
        r1.backward(torch.ones_like(r1))
        r2.backward(torch.ones_like(r2))
        torch.testing.assert_close(t1.grad, t2.grad, rtol=1e-5, atol=1e-5)
    assert kiln.stats()["graphs_compiled"] <= 2 * 2  # forward + backward, at most one recompile


def test_unspec_float_scale_factor_in_interpolate():
    def fn(image, scale_factor):
        return F.interpolate(image[None], size=None, scale_factor=scale_factor, mode="bilinear",
                             recompute_scale_factor=True, align_corners=False)[0].shape

    x = torch.rand([3, 427, 640])
    for s in (1.873536229133606, 0.5, 1.25):
        got, want = both(fn, x, s)
        assert got == want


def test_unspec_float_scale_factor_in_interpolate_values():
    def fn(image, scale_factor):
        return F.interpolate(image[None], scale_factor=scale_factor, mode="bilinear",
                             recompute_scale_factor=True, align_corners=False)[0]

    x = torch.rand([2, 9, 10])
    c = kiln.compile(fn)
    for s in (1.873536229133606, 0.5, 1.25):
        same(c(x, s), fn(x, s))


def test_unspec_isinstance_of_a_size_is_int():
    def fn(x):
        assert isinstance(x.size(0), int)
        return x * 2

    c = kiln.compile(fn)
    x = torch.randn(20)
    same(c(x), fn(x))
    y = torch.randn(30)
    torch._dynamo.mark_dynamic(y, 0)
    same(c(y), fn(y))


def test_unspec_mark_dynamic_on_a_size_one_dim():
    def fn(x):
        return x * 2

    x = torch.randn(1)
    torch._dynamo.mark_dynamic(x, 0)
    same(kiln.compile(fn)(x), fn(x))


def test_unspec_conv1d_padding_from_shape_arithmetic():
    kernel = torch.randn(1, 1, 4)

    def fn(x):
        padding = math.ceil((kernel.shape[-1] + x.shape[-1] % 2) / 2) - 1
        return F.conv1d(x, kernel, padding=padding, stride=2)

    c = kiln.compile(fn)
    for n in (175, 249, 250, 176):
        x = torch.randn(1, 1, n)
        same(c(x), fn(x))


def test_unspec_rshift_uint8_dynamic():
    def fn(t):
        return (t >> 2).to(torch.long)

    x = torch.tensor([4, 4, 16, 32], dtype=torch.uint8)
    same(kiln.compile(fn, fullgraph=True, dynamic=True)(x), fn(x))


@pytest.mark.parametrize("variant", range(4))
def test_unspec_item_float_into_torch_tensor(variant):
    fns = [
        lambda v: torch.tensor([v.item()]),
        lambda v: torch.tensor([[v.item()], [2.0]]),
        lambda v: torch.tensor(v.item()),
        lambda v: torch.tensor((v.item(),)),
    ]
    fn = fns[variant]
    c = kiln.compile(fn)
    for _ in range(3):
        r = torch.randn(1)
        same(c(r), fn(r))


@pytest.mark.parametrize("variant", range(4))
def test_unspec_torch_tensor_of_tensors(variant):
    def f2():
        a = torch.tensor([[[123]]])
        return torch.tensor([a, a])

    def f3():
        a = torch.tensor(123)
        return torch.tensor([a, a])

    def f4():
        a = torch.tensor(123)
        b = torch.tensor([[[456]]])
        return torch.tensor([a, b])

    def f5():
        a = np.array([1, 2])
        return torch.tensor([a, a])

    fn = [f2, f3, f4, f5][variant]
    same(kiln.compile(fn)(), fn())


def test_unspec_int_of_a_size_comparison():
    def fn(x):
        y = x.size(0)
        return x * int(y == 0)

    c = kiln.compile(fn, fullgraph=True)
    for n in (2, 3, 4):
        x = torch.randn(n, 3)
        same(c(x), fn(x))


def test_unspec_sum_over_a_tuple_of_dims():
    def fn(inputs, dim):
        return torch.sum(inputs, dim)

    x = torch.randn(16, 5, 6, 6)
    c = kiln.compile(fn, dynamic=True, fullgraph=True)
    for dim in ((-1, 1, 0, 2), (1, 2), (0,)):
        same(c(x, dim), fn(x, dim))


def test_unspec_max_of_item_and_int():
    def fn(x):
        return torch.ones(max(x.item(), 1024))

    c = kiln.compile(fn)
    for v in (1000, 2000, 1024, 5):
        x = torch.tensor([v])
        same(c(x), fn(x))


def test_unspec_int_dim_into_an_int_list_argument():
    def fn(x, dim):
        return torch.amin(x, dim=dim, keepdim=True)

    x = torch.randn(4, 4, 4)
    c = kiln.compile(fn, dynamic=True, fullgraph=True)
    for d in (2, 1, 0):
        same(c(x, d), fn(x, d))


def test_unspec_exponential_with_kwargs_dict():
    def fn(inputs, kw):
        return inputs.exponential_(**kw)

    kw = {"lambd": 10, "generator": None}
    a, b = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    torch.manual_seed(0)
    want = fn(a, kw)
    torch.manual_seed(0)
    got = kiln.compile(fn, dynamic=True)(b, kw)
    same(got, want)
    same(b, a)  # the input was filled in place as in eager


def test_unspec_default_int_argument_of_an_inlined_function():
    def g(x, i=8):
        return x * i

    def fn(x):
        return g(x)

    x = torch.randn(2, 3, 4)
    same(kiln.compile(fn, dynamic=True)(x), fn(x))


@pytest.mark.xfail(strict=True, reason='a float argument compared in Python (y == 5.0) is specialized per value: 7 graphs for 8 calls; TorchDynamo: 4')
def test_unspec_float_input_branch_and_nan():
    def f(x, y):
        if y == 5.0:
            return x + 2
        return x + y

    x = torch.randn(3)
    calls = [(x, 3.0), (x, 4.0), (x, 5.0), (x, math.nan), (x, 4.5), (x, 5.0), (x, math.inf), (x, -math.inf)]
    compiles_not_more(f, calls)


@pytest.mark.xfail(strict=True, reason='a float argument used in Python arithmetic that is returned (y * 2) is specialized per value: 5 graphs; TorchDynamo: 1')
def test_unspec_float_output():
    def f(x, y):
        return x + 1, y * 2

    x = torch.randn(3)
    compiles_not_more(f, [(x, 3.0), (x, 4.0), (x, 5.0), (x, -0.0), (x, 1e300)])


def test_unspec_item_then_branch_in_helper():
    def test(y):
        return y > 2

    def fn(x):
        x = x + 1
        y = x.item()
        if test(y):
            return x * 2
        return x * 3

    c = kiln.compile(fn)
    for v in (3.0, 0.5, 1.5, 7.0):
        x = torch.tensor([v])
        same(c(x), fn(x))
    x = torch.tensor([3.0])
    kg, kb = kiln_counts(fn, x)
    dg, db = dynamo_counts(fn, x)
    assert kg <= dg, (kg, dg)


def test_unspec_bool_tensor_from_size_arithmetic():
    def f(x):
        y = torch.empty((x.size(0) // 13) * 13)
        return torch.tensor(y.numel() == 0)

    c = kiln.compile(f, dynamic=True, fullgraph=True)
    assert c(torch.empty(8)).item()
    assert not c(torch.empty(13)).item()
    assert c(torch.empty(12)).item()


def test_unspec_sqrt_of_shape():
    def fn(x):
        return x / x.shape[0] ** 0.5, x.shape[-1] ** 0.5

    c = kiln.compile(fn)
    for n in (4, 9, 7, 16, 3):
        x = torch.randn(n, 5)
        same(c(x), fn(x))


def test_unspec_math_sqrt_of_int_argument():
    def fn(x, n):
        return x * math.sqrt(n), math.sqrt(n)

    c = kiln.compile(fn)
    for n in (4, 9, 2, 3, 100):
        x = torch.randn(3)
        same(c(x, n), fn(x, n))


def test_unspec_math_functions_of_float_argument():
    def fn(x, a):
        return x * math.floor(a) + math.ceil(a), round(a, 2), int(a), math.exp(a) / (1 + a * a), a // 1, a % 1.0

    c = kiln.compile(fn)
    for a in (1.5, -2.25, 3.75, 0.1, 10.0, -0.5):
        x = torch.randn(3)
        same(c(x, a), fn(x, a))


def test_unspec_float_arithmetic_arguments():
    def fn(x, a, b, c):
        s = (a * 2.0 + b) / c - a ** 2
        return x * s + (a - b), s, a < b

    cf = kiln.compile(fn)
    for a, b, c in ((1.0, 2.0, 3.0), (0.5, -1.5, 7.0), (1e-3, 1e3, -2.0), (2.0, 1.0, 0.25)):
        x = torch.randn(4)
        same(cf(x, a, b, c), fn(x, a, b, c))


def test_unspec_float_argument_recompiles_no_more_than_dynamo():
    def fn(x, s):
        return (x * s).relu() + s

    x = torch.randn(8)
    k, d = compiles_not_more(fn, [(x, v) for v in (0.5, 1.5, 2.5, 3.5, 4.5, 5.5)])


def test_unspec_int_argument_recompiles_no_more_than_dynamo():
    def fn(x, n):
        return x * n + n // 3

    x = torch.randn(8)
    compiles_not_more(fn, [(x, v) for v in (1, 2, 3, 4, 5, 6, 7)])


def test_unspec_signed_zero_float_argument():
    def fn(x, y):
        return x + math.copysign(1.0, y), math.atan2(y, -1.0)

    c = kiln.compile(fn)
    x = torch.zeros(2)
    for y in (0.0, -0.0, 0.0, -0.0):
        same(c(x, y), fn(x, y))


def test_unspec_signed_zero_float_argument_into_tensor():
    def fn(x, y):
        return x * 0 + torch.full((2,), y), 1.0 / torch.tensor(y)

    c = kiln.compile(fn)
    x = torch.zeros(2)
    for y in (0.0, 1.0, -0.0, 2.0, 0.0):
        got, want = c(x, y), fn(x, y)
        same(got, want)
        assert torch.equal(torch.signbit(got[0]), torch.signbit(want[0]))


def test_unspec_int_argument_as_a_shape():
    def fn(x, n):
        return torch.zeros(n) + x.sum(), torch.arange(n) * 2

    c = kiln.compile(fn)
    for n in (3, 5, 7, 5, 1, 0):
        x = torch.randn(2)
        same(c(x, n), fn(x, n))


def test_unspec_large_int_argument_times_int64_tensor():
    def fn(x, n):
        return x * n + (n >> 3)

    c = kiln.compile(fn)
    x = torch.arange(4, dtype=torch.int64)
    for n in (2, 3, 2 ** 40, 2 ** 33 + 1, -(2 ** 50)):
        same(c(x, n), fn(x, n))


def test_unspec_int_argument_into_int32_tensor_wraps_as_eager():
    def fn(x, n):
        return x + n

    c = kiln.compile(fn)
    x = torch.arange(4, dtype=torch.int32)
    for n in (1, 2, 2 ** 31 - 1, 5):
        same(c(x, n), fn(x, n))


def test_unspec_float_argument_into_float64_tensor_precision():
    def fn(x, y):
        return x + y

    c = kiln.compile(fn)
    x = torch.zeros(2, dtype=torch.float64)
    for y in (0.1, 1.0000000001, 1e-300, 3.141592653589793):
        got, want = c(x, y), fn(x, y)
        assert torch.equal(got, want), (got, want)


def test_unspec_numpy_float_argument():
    def fn(x, y):
        return x * y + 1, y * 2

    c = kiln.compile(fn)
    for y in (np.float64(1.5), np.float64(2.5), np.float32(0.25)):
        x = torch.randn(3)
        got, want = c(x, y), fn(x, y)
        same(got[0], want[0])
        assert type(got[1]) is type(want[1]) and got[1] == want[1]


def test_unspec_bool_argument():
    def fn(x, flag):
        return x + 1 if flag else x - 1, not flag

    c = kiln.compile(fn)
    x = torch.randn(3)
    for flag in (True, False, True, 1, 0):
        same(c(x, flag), fn(x, flag))


def test_unspec_item_arithmetic():
    def fn(x):
        s = x.sum().item()
        m = x.max().item()
        return x / (abs(s) + 1) + m, s * 2 + m

    c = kiln.compile(fn)
    for _ in range(3):
        x = torch.randn(5)
        same(c(x), fn(x))


def test_unspec_item_of_int_tensor_as_a_size():
    def fn(x, n):
        return x[: n.item()] * 2, torch.ones(n.item())

    c = kiln.compile(fn)
    for k in (3, 2, 5, 3):
        x = torch.randn(6)
        same(c(x, torch.tensor(k)), fn(x, torch.tensor(k)))


def test_unspec_item_compared_with_float_argument():
    def fn(x, thr):
        if x.mean().item() > thr:
            return x + thr
        return x - thr

    c = kiln.compile(fn)
    x = torch.ones(3)
    for thr in (0.5, 1.5, 0.5, 2.0, -1.0):
        same(c(x, thr), fn(x, thr))


def test_unspec_float_and_int_in_a_list_argument():
    def fn(x, scales):
        out = x
        for s in scales:
            out = out * s
        return out, sum(scales)

    c = kiln.compile(fn)
    for scales in ([1.5, 2], [0.5, 3], [0.5, 3, 4.0], [2.0]):
        x = torch.randn(3)
        same(c(x, scales), fn(x, scales))


# ==============================================================================================
# 2. test_recompiles.py: when kiln compiles again, and never a stale entry
# ==============================================================================================

def _sizes_calls():
    out = []
    for n in (2, 3, 4, 4, 5, 5, 6):
        out.append((torch.randn(n), torch.randn(n)))
    return out


@pytest.mark.parametrize("dynamic", [None, False, True])
def test_recompile_automatic_dynamic_sizes(dynamic):
    def foo(x, y):
        return x * y

    compiles_not_more(foo, _sizes_calls(), dynamic=dynamic)


def test_recompile_true_false_flop():
    def foo(x, y):
        if x:
            return y * 2
        return y * y

    calls = [(True, torch.randn(2)), (False, torch.randn(2)), (True, torch.randn(3)), (True, torch.randn(4)),
             (True, torch.randn(5))]
    compiles_not_more(foo, calls, fullgraph=True)


@pytest.mark.xfail(strict=True, reason='an int argument that changed type (tensor -> 3 -> tensor -> 4) stays specialized to 3: 4 graphs; TorchDynamo: 3')
def test_recompile_tensor_then_scalar_swap():
    def foo(x, y):
        return x * y

    calls = [(torch.randn(2), torch.randn(2)), (torch.randn(3), 3), (torch.randn(4), torch.randn(4)),
             (torch.randn(4), torch.randn(4)), (torch.randn(5), 4), (torch.randn(5), 4), (torch.randn(6), torch.randn(6))]
    compiles_not_more(foo, calls)


def test_recompile_aliasing_of_inputs_changes():
    def foo(a, b, c):
        a.add_(b)
        return c + 1

    cf = kiln.compile(foo, fullgraph=True)
    x, y, z = torch.randn(3), torch.randn(3), torch.randn(3)
    for order in ((x, y, z), (z, y, x)):
        ka = [t.clone() for t in order]
        ea = [t.clone() for t in order]
        same(cf(*ka), foo(*ea))
        same(ka, ea)
    # a and c alias now: eager's c + 1 sees the update
    xk, xe = x.clone(), x.clone()
    same(cf(xk, y.clone(), xk), foo(xe, y.clone(), xe))
    same(xk, xe)


def test_recompile_aliasing_with_globals():
    g = {"g1": torch.randn(3), "g2": torch.randn(3)}
    fn_globals = {"g1": g["g1"], "g2": g["g2"]}
    src = "def foo(a):\n    a.add_(g1)\n    return g2 + 1\n"
    exec(src, fn_globals)
    foo = fn_globals["foo"]
    cf = kiln.compile(foo, fullgraph=True)
    z = torch.randn(3)
    same(cf(z.clone()), foo(z.clone()))
    # the argument is the global g2 itself: the in-place add is seen by g2 + 1
    fn_globals["g2"] = g["g2"].clone()
    a = fn_globals["g2"]
    got = cf(a)
    fn_globals["g2"] = g["g2"].clone()
    b = fn_globals["g2"]
    want = foo(b)
    same(got, want)
    same(a, b)


def test_recompile_parameter_shapes():
    w = nn.Parameter(torch.randn(3, 2))

    def foo(x):
        return x @ w

    calls = [(nn.Parameter(torch.randn(n, 3)),) for n in (1, 10, 11, 15, 15)]
    kiln.reset()
    c = kiln.compile(foo, fullgraph=True)
    for (x,) in calls:
        torch.testing.assert_close(c(x), foo(x))
    k = kiln.stats()["graphs_compiled"]
    d = dynamo_frames(foo, calls, fullgraph=True)
    assert k <= d, (k, d)


def test_recompile_module_train_eval_flips():
    torch.manual_seed(0)

    class SimpleDropout(nn.Module):
        def __init__(self):
            super().__init__()
            self.dropout = nn.Dropout(0.5)
            self.linear = nn.Linear(10, 1)

        def forward(self, x):
            return self.dropout(self.linear(x))

    model = SimpleDropout()
    x = torch.randn(10)
    kiln.reset()
    cm = kiln.compile(model, fullgraph=True)
    with torch.no_grad():
        for _ in range(6):
            model.eval()
            same(cm(x), model(x))
            model.train()
            torch.manual_seed(3)
            want = model(x)
            torch.manual_seed(3)
            got = cm(x)
            assert got.shape == want.shape
            # training-mode dropout zeroes or doubles: the result is 0 or 2 * eval's
            ev = model.eval()(x)
            model.train()
            assert torch.allclose(got, torch.zeros_like(got)) or torch.allclose(got, 2 * ev)
    assert kiln.stats()["graphs_compiled"] <= 2


def test_recompile_past_the_cache_limit_stays_right():
    def h(x, n):
        return x + n

    def g(x, n):
        x = x + n
        return h(x, n)

    def f(x, n):
        x = x + n
        return g(x, n)

    kiln.reset()
    c = kiln.compile(f, dynamic=False)
    for i in range(12):
        same(c(torch.ones(3), i), f(torch.ones(3), i))
    for i in range(12):
        same(c(torch.ones(3), i), f(torch.ones(3), i))


@pytest.mark.xfail(strict=True, reason='a closure made per call is guarded by identity (ID_MATCH on the function): a new entry per call, then the cache limit and eager; TorchDynamo: 2 graphs')
def test_recompile_closed_over_ints():
    def make(i):
        def g(y):
            return y + i
        return g

    def h(x, g):
        return g(x)

    calls = [(torch.randn(5), make(i)) for i in range(10)]
    compiles_not_more(h, calls)


def test_recompile_shrinking_sizes_to_one_and_zero():
    def f(x):
        return x * x

    compiles_not_more(f, [(torch.randn(n),) for n in (3, 2, 1, 0, 1, 2)])


def test_recompile_branch_on_size_across_sizes():
    def f(x):
        if x.size(0) < 10:
            return x * 1
        return x + 10

    c = kiln.compile(f, fullgraph=True)
    for n in (3, 2, 1, 0, 12, 10, 9, 40):
        same(c(torch.zeros(n)), f(torch.zeros(n)))


def test_recompile_branch_on_size_two():
    def f(x):
        if x.size(0) < 2:
            return x * 1
        return x + 10

    c = kiln.compile(f, fullgraph=True)
    for n in (1, 0, 2, 5, 1):
        x = torch.randn(n)
        same(c(x), f(x))


def test_recompile_requires_grad_flip():
    def fn(x):
        return (x * 2).sin()

    c = kiln.compile(fn)
    x = torch.randn(4)
    same(c(x), fn(x))
    xr = x.clone().requires_grad_(True)
    out = c(xr)
    assert out.requires_grad
    out.sum().backward()
    torch.testing.assert_close(xr.grad, 2 * torch.cos(2 * x))
    same(c(x), fn(x))
    assert not c(x).requires_grad


def test_recompile_dtype_change():
    def fn(x):
        return x * 3 + 1

    c = kiln.compile(fn)
    for dt in (torch.float32, torch.float64, torch.int64, torch.float16, torch.float32, torch.int32):
        x = (torch.randn(4) * 10).to(dt)
        same(c(x), fn(x))


def test_recompile_layout_change():
    def fn(x):
        return x + x.flatten().view(x.shape)[0]

    c = kiln.compile(fn)
    base = torch.randn(4, 4)
    for x in (base, base.t(), base[::2], base.t().contiguous(), base[:, 1:]):
        try:
            want = fn(x)
        except RuntimeError as e:
            with pytest.raises(RuntimeError):
                c(x)
            continue
        same(c(x), want)


def test_recompile_rank_change():
    def fn(x):
        return x.sum(-1) + x.dim()

    c = kiln.compile(fn)
    for shape in ((3,), (3, 4), (2, 3, 4), (3,), ()):
        x = torch.randn(shape)
        same(c(x), fn(x))


def test_recompile_grad_mode_change():
    w = torch.randn(3, requires_grad=True)

    def fn(x):
        return (x * w).sum()

    c = kiln.compile(fn)
    x = torch.randn(3)
    r1 = c(x)
    assert r1.requires_grad
    with torch.no_grad():
        r2 = c(x)
    assert not r2.requires_grad
    same(r2, fn(x).detach())
    assert c(x).requires_grad


def test_recompile_tuple_vs_list_argument():
    def fn(xs):
        return type(xs).__name__, xs[0] + xs[-1], len(xs)

    c = kiln.compile(fn)
    a, b, d = torch.randn(2), torch.randn(2), torch.randn(2)
    for xs in ((a, b), [a, b], [a, b, d], (a,), [b]):
        same(c(xs), fn(xs))


def test_recompile_none_vs_tensor_argument():
    def fn(x, bias=None):
        if bias is None:
            return x * 2
        return x * 2 + bias

    c = kiln.compile(fn)
    x = torch.randn(3)
    for b in (None, torch.ones(3), None, torch.zeros(3)):
        same(c(x, b), fn(x, b))
    same(c(x), fn(x))
    same(c(x, bias=torch.ones(3)), fn(x, bias=torch.ones(3)))


def test_recompile_string_argument():
    def fn(x, act):
        return getattr(torch, act)(x)

    c = kiln.compile(fn)
    x = torch.randn(3)
    for act in ("relu", "tanh", "sigmoid", "relu"):
        same(c(x, act), fn(x, act))


def test_recompile_dict_argument_keys_and_values():
    def fn(d):
        out = 0
        for k, v in d.items():
            out = out + v * len(k)
        return out

    c = kiln.compile(fn)
    for d in ({"a": torch.ones(2)}, {"ab": torch.ones(2)}, {"a": torch.ones(2), "bcd": torch.ones(2)},
              {"bcd": torch.ones(2), "a": torch.ones(2) * 3}):
        same(c(d), fn(d))


def test_recompile_list_argument_length():
    def fn(xs):
        return torch.stack(xs).sum(0) / len(xs)

    c = kiln.compile(fn)
    for n in (1, 2, 3, 2, 5):
        xs = [torch.randn(3) for _ in range(n)]
        same(c(xs), fn(xs))


def test_recompile_same_object_twice_vs_two_objects():
    def fn(a, b):
        a.mul_(2)
        return a + b

    c = kiln.compile(fn)
    x, y = torch.randn(3), torch.randn(3)
    for shared in (False, True, False, True):
        xk, xe = x.clone(), x.clone()
        yk, ye = (xk, xe) if shared else (y.clone(), y.clone())
        same(c(xk, yk), fn(xe, ye))
        same(xk, xe)


def test_recompile_generator_argument_does_not_churn():
    def fn(x, names):
        return [x * len(n) for n in names]

    kiln.reset()
    c = kiln.compile(fn)
    for _ in range(10):
        names = ["a", "bb"]
        same(c(torch.ones(2), (n for n in names)), fn(torch.ones(2), (n for n in names)))
    assert kiln.stats()["recompiles"] <= 1, kiln.stats()["recompile_reasons"][-1][:300]


def test_recompile_count_with_int_argument_dynamic_false():
    def fn(x, n):
        return x + n

    calls = [(torch.ones(3), i) for i in range(5)]
    compiles_not_more(fn, calls, dynamic=False)


def test_recompile_count_repeated_identical_calls():
    def fn(x, y):
        return x.sin() + y

    x = torch.randn(5)
    k, d = compiles_not_more(fn, [(x, 1.0)] * 5 + [(torch.randn(5), 1.0)] * 3)
    assert k == 1


# ==============================================================================================
# 3. test_global.py: globals read and written by the compiled function
# ==============================================================================================

class Pair:
    def __init__(self, x, y):
        self.x = x
        self.y = y


g_counter = 1
g_list = [0, 1, 2]
g_dict = {"a": 0, "b": 1}
g_object = Pair(1, 1)
g_tensor = torch.zeros(10)
g_scale = 2.0
g_flag = True
g_fn = torch.sin
g_maybe = None
g_module = nn.Linear(3, 3)

_name = 0


def fresh_name():
    global _name
    r = f"v{_name}"
    _name += 1
    return r


def reset_name():
    global _name
    _name = 0


def _make_module(name, source):
    """A real module (registered in sys.modules) made from source, as another file's globals."""
    mod = types.ModuleType(name)
    mod.__file__ = f"<{name}>"
    exec(compile(source, mod.__file__, "exec"), mod.__dict__)
    sys.modules[name] = mod
    return mod


OTHER = _make_module("kiln_port_other_module", """
import torch
g_tensor_export = torch.zeros(10)
global_flag = False
scale = 3.0
counter = 0
table = {"k": 1}

def set_flag_true():
    global global_flag
    global_flag = True

def set_flag_false():
    global global_flag
    global_flag = False

def bump():
    global counter
    counter += 1
    return counter

def scaled(x):
    return x * scale

def read_table(x):
    return x + table["k"]
""")


def test_store_global_increment():
    global g_counter
    g_counter = 1

    def fn(x):
        global g_counter
        val = x + g_counter
        g_counter += 1
        return val

    x = torch.randn(10)
    r1 = kiln.compile(fn)(x)
    assert g_counter == 2
    r2 = fn(x)
    same(r2 - r1, torch.ones(10))
    assert g_counter == 3


def test_store_global_twice_and_recompiled_wrapper():
    global g_counter
    g_counter = 1

    def fn(x):
        global g_counter
        val = x + g_counter
        g_counter += 1
        g_counter += 1
        return val

    x = torch.randn(10)
    r1 = kiln.compile(fn)(x)
    r2 = kiln.compile(fn)(x)
    same(r2 - r1, 2 * torch.ones(10))
    assert g_counter == 5


def test_store_global_repeated_calls_see_the_new_value():
    global g_counter
    g_counter = 0

    def fn(x):
        global g_counter
        g_counter += 1
        return x * g_counter

    c = kiln.compile(fn)
    x = torch.ones(2)
    for i in range(1, 6):
        same(c(x), x * i)
    assert g_counter == 5


def test_store_global_new_name():
    def fn(x):
        global g_counter_new
        g_counter_new = x + 1
        return x + g_counter_new

    x = torch.randn(10)
    globals().pop("g_counter_new", None)
    same(kiln.compile(fn)(x), x + x + 1)
    same(globals()["g_counter_new"], x + 1)
    del globals()["g_counter_new"]


def test_store_global_list_item():
    global g_list
    g_list = [0, 1, 2]

    def fn(x):
        val = x + g_list[1]
        g_list[1] += 1
        return val

    x = torch.randn(10)
    r1 = kiln.compile(fn)(x)
    r2 = fn(x)
    same(r2 - r1, torch.ones(10))
    assert g_list == [0, 3, 2]


def test_store_global_list_rebound_by_comprehension():
    global g_list
    g_list = [0, 1, 2]

    def fn(x):
        global g_list
        val = x + g_list[1]
        g_list = [v + 1 for v in g_list]
        return val

    x = torch.randn(10)
    c = kiln.compile(fn)
    r1 = c(x)
    r2 = fn(x)
    same(r2 - r1, torch.ones(10))
    r3 = c(x)
    same(r3 - r2, torch.ones(10))
    assert g_list == [3, 4, 5]


def test_store_global_dict_item():
    global g_dict
    g_dict = {"a": 0, "b": 1}

    def fn(x):
        val = x + g_dict["b"]
        g_dict["b"] += 1
        return val

    x = torch.randn(10)
    c = kiln.compile(fn)
    r1 = c(x)
    r2 = fn(x)
    same(r2 - r1, torch.ones(10))
    r3 = c(x)
    same(r3 - r2, torch.ones(10))
    assert g_dict == {"a": 0, "b": 4}


def test_store_global_dict_rebound_by_comprehension():
    global g_dict
    g_dict = {"a": 0, "b": 1}

    def fn(x):
        global g_dict
        g_dict = {k: v + 1 for k, v in g_dict.items()}
        return x + g_dict["b"]

    x = torch.randn(10)
    c = kiln.compile(fn)
    r1 = c(x)
    r2 = fn(x)
    same(r2 - r1, torch.ones(10))
    same(c(x) - r2, torch.ones(10))
    assert g_dict == {"a": 3, "b": 4}


def test_store_global_object_attribute():
    global g_object
    g_object = Pair(1, 1)

    def fn(x):
        val = x + g_object.y
        g_object.y += 1
        return val

    x = torch.randn(10)
    c = kiln.compile(fn)
    r1 = c(x)
    r2 = fn(x)
    same(r2 - r1, torch.ones(10))
    same(c(x) - r2, torch.ones(10))
    assert g_object.y == 4


def test_store_global_of_another_module():
    OTHER.g_tensor_export = torch.zeros(10)

    def fn(x):
        val = x + OTHER.g_tensor_export
        OTHER.g_tensor_export = OTHER.g_tensor_export + 1
        return val

    x = torch.randn(10)
    c = kiln.compile(fn)
    r1 = c(x)
    r2 = fn(x)
    same(r2 - r1, torch.ones(10))
    same(c(x) - r2, torch.ones(10))
    same(OTHER.g_tensor_export, torch.full((10,), 3.0))


def test_store_global_in_inlined_constructor():
    class Variable:
        def __init__(self, value, name=None):
            self.value = value
            self.name = name or fresh_name()

    def fn(a, b):
        a = Variable(a)
        b = Variable(b)
        return a.value + b.value, a.name + b.name

    reset_name()
    a, b = torch.randn(10), torch.randn(10)
    c = kiln.compile(fn)
    v0, s0 = c(a, b)
    assert s0 == "v0v1" and _name == 2
    same(v0, a + b)
    v1, s1 = c(a, b)
    assert s1 == "v2v3" and _name == 4
    reset_name()


def test_store_global_in_inlined_staticmethod():
    class Variable:
        def __init__(self, value, name=None):
            self.value = value
            self.name = name or fresh_name()

        @staticmethod
        def constant(value, name=None):
            return Variable(value, name)

    def fn(a, b):
        a = Variable.constant(a)
        b = Variable.constant(b)
        return a.value + b.value, a.name + b.name

    reset_name()
    a, b = torch.randn(10), torch.randn(10)
    c = kiln.compile(fn)
    assert c(a, b)[1] == "v0v1"
    assert c(a, b)[1] == "v2v3"
    reset_name()


def test_store_global_crossfile_inlined_setters():
    def fn(x):
        OTHER.set_flag_true()
        OTHER.set_flag_false()
        return x + 1

    def fn_set_true(x):
        OTHER.set_flag_true()
        return x + 1

    OTHER.global_flag = False
    same(kiln.compile(fn_set_true)(torch.ones(2, 2)), torch.ones(2, 2) + 1)
    assert OTHER.global_flag is True
    same(kiln.compile(fn)(torch.ones(2, 2)), torch.ones(2, 2) + 1)
    assert OTHER.global_flag is False


def test_store_global_crossfile_counter_bumped_per_call():
    OTHER.counter = 0

    def fn(x):
        n = OTHER.bump()
        return x * n

    c = kiln.compile(fn)
    for i in range(1, 5):
        same(c(torch.ones(2)), torch.ones(2) * i)
    assert OTHER.counter == 4


def _load_unregistered(tmpdir, name, source):
    path = os.path.join(tmpdir, f"{name}.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert name not in sys.modules
    return mod


def test_globals_of_an_unregistered_importlib_module():
    with tempfile.TemporaryDirectory() as tmp:
        mod = _load_unregistered(tmp, "kiln_port_unreg_a", (
            "import functools\n"
            "def _helper(x, scale):\n    return x.sin() * scale\n"
            "def my_fn(x, scale):\n    return _helper(x, scale)\n"
            "fn = functools.partial(my_fn, scale=2)\n"))
        x = torch.randn(4, 4)
        c = kiln.compile(mod.fn, fullgraph=True)
        same(c(x), mod.fn(x))
        mod._helper = lambda x, scale: x.cos() * scale  # a global of that module replaced
        same(c(x), mod.fn(x))


def test_store_global_in_an_unregistered_importlib_module():
    with tempfile.TemporaryDirectory() as tmp:
        mod = _load_unregistered(tmp, "kiln_port_unreg_b", (
            "import functools\nflag = 0\n"
            "def my_fn(x, scale):\n    global flag\n    flag = scale\n    return x + flag\n"
            "fn = functools.partial(my_fn, scale=2)\n"))
        x = torch.randn(4, 4)
        mod.flag = 0
        same(kiln.compile(mod.fn)(x), x + 2)
        assert mod.flag == 2


# --- DELETE_GLOBAL ---

_ABSENT = object()


class temp_globals:
    def __init__(self, ns, **updates):
        self.ns, self.updates = ns, updates

    def __enter__(self):
        self.saved = {k: self.ns.get(k, _ABSENT) for k in self.updates}
        for k, v in self.updates.items():
            if v is _ABSENT:
                self.ns.pop(k, None)
            else:
                self.ns[k] = v

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is _ABSENT:
                self.ns.pop(k, None)
            else:
                self.ns[k] = v


_FULLGRAPH = [False, True]


@pytest.mark.parametrize("fullgraph", _FULLGRAPH)
def test_delete_global(fullgraph):
    with temp_globals(globals(), _dg_a=10):
        def fn(x):
            global _dg_a
            del _dg_a
            return x + 1

        x = torch.ones(2, 2)
        same(kiln.compile(fn, fullgraph=fullgraph)(x), x + 1)
        assert "_dg_a" not in globals()


def test_delete_missing_global_raises_name_error():
    with temp_globals(globals(), _dg_a=_ABSENT):
        def fn(x):
            global _dg_a
            del _dg_a
            return x + 1

        with pytest.raises(NameError, match="_dg_a"):
            fn(torch.ones(2))
        with pytest.raises(NameError, match="_dg_a"):
            kiln.compile(fn)(torch.ones(2))


@pytest.mark.parametrize("fullgraph", _FULLGRAPH)
def test_delete_missing_global_caught_by_caller(fullgraph):
    with temp_globals(globals(), _dg_a=_ABSENT):
        def inner():
            global _dg_a
            del _dg_a

        def fn(x):
            try:
                inner()
            except NameError:
                return x + 2
            return x + 1

        x = torch.ones(2, 2)
        same(kiln.compile(fn)(x), fn(x))
        same(kiln.compile(fn, fullgraph=fullgraph)(x), x + 2)


@pytest.mark.parametrize("fullgraph", _FULLGRAPH)
def test_delete_global_created_then_deleted(fullgraph):
    with temp_globals(globals(), _dg_a=_ABSENT):
        def fn(x):
            global _dg_a
            _dg_a = 1
            del _dg_a
            return x + 1

        x = torch.ones(2, 2)
        same(kiln.compile(fn, fullgraph=fullgraph)(x), x + 1)
        assert "_dg_a" not in globals()


def test_delete_global_twice_raises():
    with temp_globals(globals(), _dg_a=1):
        def fn(x):
            global _dg_a
            del _dg_a
            del _dg_a  # noqa: F821
            return x + 1

        with pytest.raises(NameError):
            kiln.compile(fn)(torch.ones(2))
        assert "_dg_a" not in globals()


@pytest.mark.parametrize("fullgraph", _FULLGRAPH)
def test_delete_global_then_store(fullgraph):
    with temp_globals(globals(), _dg_a=1):
        def fn(x):
            global _dg_a
            del _dg_a
            _dg_a = 7
            return x + 1

        x = torch.ones(2, 2)
        same(kiln.compile(fn, fullgraph=fullgraph)(x), x + 1)
        assert globals()["_dg_a"] == 7


@pytest.mark.parametrize("fullgraph", _FULLGRAPH)
def test_delete_tensor_global_frees_it(fullgraph):
    with temp_globals(globals(), _dg_a=_ABSENT):
        def fn(x):
            global _dg_a
            del _dg_a
            return x + 1

        t = torch.ones(4)
        globals()["_dg_a"] = t
        ref = weakref.ref(t)
        del t
        x = torch.ones(2, 2)
        same(kiln.compile(fn, fullgraph=fullgraph)(x), x + 1)
        assert "_dg_a" not in globals()
        assert ref() is None, "the deleted global's tensor is kept alive"


@pytest.mark.parametrize("present_first", [True, False])
def test_delete_global_presence_flip(present_first):
    with temp_globals(globals(), _dg_a=1 if present_first else _ABSENT):
        def fn(x):
            global _dg_a
            y = x + 1
            try:
                del _dg_a
            except NameError:
                y = y + 1
            return y

        x = torch.ones(2, 2)
        c = kiln.compile(fn)
        if present_first:
            same(c(x), x + 1)
            assert "_dg_a" not in globals()
            same(c(x), x + 2)
        else:
            same(c(x), x + 2)
            globals()["_dg_a"] = 1
            same(c(x), x + 1)
            assert "_dg_a" not in globals()


# --- globals changed between calls ---

def test_global_float_changed_between_calls():
    global g_scale

    def fn(x):
        return x * g_scale

    c = kiln.compile(fn)
    x = torch.randn(3)
    try:
        for v in (2.0, 3.0, -1.5, 2.0, 0.0):
            g_scale = v
            same(c(x), fn(x))
    finally:
        g_scale = 2.0


def test_global_int_changed_between_calls():
    global g_counter

    def fn(x):
        return x + g_counter, g_counter * 2

    c = kiln.compile(fn)
    x = torch.randn(3)
    for v in (1, 2, 3, 4, 10):
        g_counter = v
        same(c(x), fn(x))


def test_global_tensor_rebound_between_calls():
    global g_tensor

    def fn(x):
        return x + g_tensor

    c = kiln.compile(fn)
    x = torch.randn(10)
    for _ in range(3):
        g_tensor = torch.randn(10)
        same(c(x), fn(x))
    g_tensor = torch.randn(2, 10)  # other shape
    same(c(x), fn(x))
    g_tensor = torch.zeros(10)


def test_global_tensor_mutated_in_place_between_calls():
    def fn(x):
        return x + g_tensor

    c = kiln.compile(fn)
    x = torch.randn(10)
    same(c(x), fn(x))
    g_tensor.add_(5)
    same(c(x), fn(x))
    g_tensor.zero_()


def test_global_tensor_mutated_in_place_by_the_function():
    global g_tensor
    g_tensor = torch.zeros(10)

    def fn(x):
        g_tensor.add_(x)
        return g_tensor * 2

    c = kiln.compile(fn)
    x = torch.ones(10)
    for i in range(1, 4):
        same(c(x), torch.full((10,), 2.0 * i))
    same(g_tensor, torch.full((10,), 3.0))
    g_tensor = torch.zeros(10)


def test_global_function_replaced_between_calls():
    global g_fn

    def fn(x):
        return g_fn(x) + 1

    c = kiln.compile(fn)
    x = torch.randn(4)
    try:
        for f in (torch.sin, torch.cos, lambda t: t * 3, torch.sin):
            g_fn = f
            same(c(x), fn(x))
    finally:
        g_fn = torch.sin


def test_global_flag_flipped_between_calls():
    global g_flag

    def fn(x):
        if g_flag:
            return x + 1
        return x - 1

    c = kiln.compile(fn)
    x = torch.randn(3)
    for v in (True, False, True, False):
        g_flag = v
        same(c(x), fn(x))
    g_flag = True


def test_global_none_then_tensor():
    global g_maybe

    def fn(x):
        if g_maybe is None:
            return x * 2
        return x * 2 + g_maybe

    c = kiln.compile(fn)
    x = torch.randn(3)
    for v in (None, torch.ones(3), None, torch.full((3,), 4.0)):
        g_maybe = v
        same(c(x), fn(x))
    g_maybe = None


def test_global_module_replaced_and_weights_changed():
    global g_module
    torch.manual_seed(0)
    g_module = nn.Linear(3, 3)

    def fn(x):
        return g_module(x).relu()

    c = kiln.compile(fn)
    x = torch.randn(2, 3)
    with torch.no_grad():
        same(c(x), fn(x))
        g_module.weight.mul_(2)
        same(c(x), fn(x))
        g_module = nn.Linear(3, 3)
        same(c(x), fn(x))
        g_module = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
        same(c(x), fn(x))


def test_global_list_appended_outside():
    global g_list
    g_list = [1.0]

    def fn(x):
        out = x
        for v in g_list:
            out = out * v
        return out + len(g_list)

    c = kiln.compile(fn)
    x = torch.ones(2)
    for v in (2.0, 3.0, 0.5):
        same(c(x), fn(x))
        g_list.append(v)
    g_list[0] = 10.0
    same(c(x), fn(x))
    g_list = [0, 1, 2]


def test_global_dict_changed_outside():
    global g_dict
    g_dict = {"a": 1.0}

    def fn(x):
        return x * g_dict.get("a", 0.0) + sum(g_dict.values())

    c = kiln.compile(fn)
    x = torch.ones(2)
    same(c(x), fn(x))
    g_dict["a"] = 3.0
    same(c(x), fn(x))
    g_dict["b"] = 5.0
    same(c(x), fn(x))
    del g_dict["a"]
    same(c(x), fn(x))
    g_dict = {"a": 0, "b": 1}


def test_global_object_attribute_changed_outside():
    global g_object
    g_object = Pair(1, 2.0)

    def fn(x):
        return x * g_object.y + g_object.x

    c = kiln.compile(fn)
    x = torch.ones(2)
    same(c(x), fn(x))
    g_object.y = 3.5
    same(c(x), fn(x))
    g_object.x = torch.ones(2)
    same(c(x), fn(x))
    g_object = Pair(-1, 0.5)
    same(c(x), fn(x))


def test_global_of_another_module_changed_between_calls():
    def fn(x):
        return OTHER.scaled(x) + OTHER.read_table(x)

    c = kiln.compile(fn)
    x = torch.ones(2)
    for s, k in ((3.0, 1), (4.0, 1), (4.0, 7), (0.5, 2)):
        OTHER.scale = s
        OTHER.table["k"] = k
        same(c(x), fn(x))
    OTHER.table = {"k": 100}
    same(c(x), fn(x))


def test_global_module_attribute_via_import_changed():
    def fn(x):
        return x * OTHER.scale

    c = kiln.compile(fn)
    x = torch.ones(2)
    for s in (1.0, 2.0, 3.0):
        OTHER.scale = s
        same(c(x), fn(x))
    OTHER.scale = 3.0


def test_global_deleted_between_calls_raises_name_error():
    def fn(x):
        return x + _kiln_port_vanishing  # noqa: F821

    globals()["_kiln_port_vanishing"] = 1.0
    c = kiln.compile(fn)
    same(c(torch.ones(2)), torch.ones(2) + 1)
    del globals()["_kiln_port_vanishing"]
    with pytest.raises(NameError):
        c(torch.ones(2))
    globals()["_kiln_port_vanishing"] = 5.0
    same(c(torch.ones(2)), torch.ones(2) + 5)
    del globals()["_kiln_port_vanishing"]


def test_global_shadowing_a_builtin():
    def fn(x):
        return x + len([1, 2, 3])

    c = kiln.compile(fn)
    same(c(torch.ones(2)), torch.ones(2) + 3)
    globals()["len"] = lambda s: 100
    try:
        same(c(torch.ones(2)), torch.ones(2) + 100)
    finally:
        del globals()["len"]
    same(c(torch.ones(2)), torch.ones(2) + 3)


def test_builtins_module_patched_between_calls():
    import builtins

    def fn(x):
        return x + abs(-2)

    c = kiln.compile(fn)
    same(c(torch.ones(2)), torch.ones(2) + 2)
    orig = builtins.abs
    builtins.abs = lambda v: 50
    try:
        same(c(torch.ones(2)), fn(torch.ones(2)))
    finally:
        builtins.abs = orig


def test_global_counts_not_more_than_dynamo():
    global g_counter
    g_counter = 1

    def fn(x):
        global g_counter
        g_counter += 1
        return x + g_counter

    kg, kb = kiln_counts(fn, torch.ones(2))
    dg, db = dynamo_counts(fn, torch.ones(2))
    assert kg <= dg and kb <= db


# ==============================================================================================
# 4. guards on the state a result depends on
# ==============================================================================================

def test_guard_closure_cell_rebound():
    scale = 2.0

    def fn(x):
        return x * scale

    c = kiln.compile(fn)
    x = torch.randn(3)
    for v in (2.0, 3.0, 2.0, -1.0):
        scale = v
        same(c(x), fn(x))


def test_guard_closure_cell_tensor_rebound():
    bias = torch.ones(3)

    def fn(x):
        return x + bias

    c = kiln.compile(fn)
    x = torch.randn(3)
    same(c(x), fn(x))
    bias = torch.full((3,), 7.0)
    same(c(x), fn(x))
    bias = torch.zeros(2, 3)
    same(c(x), fn(x))


def test_guard_closure_cell_rebound_by_nonlocal_in_the_function():
    count = 0

    def fn(x):
        nonlocal count
        count += 1
        return x * count

    c = kiln.compile(fn)
    for i in range(1, 5):
        same(c(torch.ones(2)), torch.ones(2) * i)
    assert count == 4


def test_guard_closure_cell_holding_a_function():
    act = torch.relu

    def fn(x):
        return act(x) * 2

    c = kiln.compile(fn)
    x = torch.randn(4)
    for f in (torch.relu, torch.tanh, torch.sigmoid):
        act = f
        same(c(x), fn(x))


def test_guard_closure_cell_list_mutated():
    cfg = [1.0, 2.0]

    def fn(x):
        return x * cfg[0] + cfg[-1]

    c = kiln.compile(fn)
    x = torch.ones(2)
    same(c(x), fn(x))
    cfg[0] = 5.0
    same(c(x), fn(x))
    cfg.append(9.0)
    same(c(x), fn(x))


def test_guard_nested_closure_cells():
    def outer(k):
        def mid(x):
            def inner(y):
                return y * k
            return inner(x) + k
        return mid

    def fn(x, f):
        return f(x)

    c = kiln.compile(fn)
    x = torch.ones(2)
    for k in (1, 2, 3.5, 1):
        same(c(x, outer(k)), fn(x, outer(k)))


def test_guard_module_plain_attribute():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = 2.0
            self.use_bias = True
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            y = self.lin(x) * self.scale
            if self.use_bias:
                y = y + 1
            return y

    m = M()
    c = kiln.compile(m)
    x = torch.randn(2, 3)
    with torch.no_grad():
        same(c(x), m(x))
        m.scale = 5.0
        same(c(x), m(x))
        m.use_bias = False
        same(c(x), m(x))
        m.scale = 2.0
        m.use_bias = True
        same(c(x), m(x))


def test_guard_module_attribute_added_later():
    class M(nn.Module):
        def forward(self, x):
            if hasattr(self, "extra"):
                return x + self.extra
            return x

    m = M()
    c = kiln.compile(m)
    x = torch.randn(3)
    same(c(x), m(x))
    m.extra = 4.0
    same(c(x), m(x))
    del m.extra
    same(c(x), m(x))


@pytest.mark.xfail(strict=True, reason="STALE: a function stored in an nn.Module instance's __dict__ shadowing a class method (m.act = lambda) is not guarded; the old method keeps running")
def test_guard_module_method_replaced_on_instance():
    class M(nn.Module):
        def act(self, x):
            return x.relu()

        def forward(self, x):
            return self.act(x) + 1

    m = M()
    c = kiln.compile(m)
    x = torch.randn(4)
    same(c(x), m(x))
    m.act = lambda t: t.tanh()
    same(c(x), m(x))


def test_guard_module_forward_hook_added_and_removed():
    m = nn.Linear(3, 3)
    c = kiln.compile(m)
    x = torch.randn(2, 3)
    with torch.no_grad():
        same(c(x), m(x))
        h = m.register_forward_hook(lambda mod, inp, out: out * 10)
        same(c(x), m(x))
        h.remove()
        same(c(x), m(x))
        h = m.register_forward_pre_hook(lambda mod, inp: (inp[0] + 1,))
        same(c(x), m(x))
        h.remove()


def test_guard_module_training_flag():
    m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    c = kiln.compile(m)
    x = torch.randn(8, 4)
    with torch.no_grad():
        m.eval()
        same(c(x), m(x))
        m.train()
        m2_state = {k: v.clone() for k, v in m.state_dict().items()}
        got = c(x)
        after_kiln = {k: v.clone() for k, v in m.state_dict().items()}
        m.load_state_dict(m2_state)
        want = m(x)
        same(got, want)
        same(after_kiln, {k: v.clone() for k, v in m.state_dict().items()})
        m.eval()
        same(c(x), m(x))


def test_guard_submodule_replaced():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = nn.ReLU()

        def forward(self, x):
            return self.act(x) * 2

    m = M()
    c = kiln.compile(m)
    x = torch.randn(5)
    same(c(x), m(x))
    m.act = nn.Tanh()
    same(c(x), m(x))
    m.act = nn.Identity()
    same(c(x), m(x))


def test_guard_os_environ_read():
    key = "KILN_PORT_TEST_ENV_FLAG"

    def fn(x):
        if os.environ.get(key, "0") == "1":
            return x + 1
        return x - 1

    c = kiln.compile(fn)
    x = torch.randn(3)
    os.environ.pop(key, None)
    try:
        same(c(x), fn(x))
        os.environ[key] = "1"
        same(c(x), fn(x))
        os.environ[key] = "0"
        same(c(x), fn(x))
        del os.environ[key]
        same(c(x), fn(x))
    finally:
        os.environ.pop(key, None)


def test_guard_os_environ_value_as_number():
    key = "KILN_PORT_TEST_ENV_SCALE"

    def fn(x):
        return x * float(os.environ.get(key, "1.0"))

    c = kiln.compile(fn)
    x = torch.ones(3)
    try:
        for v in ("1.0", "2.5", "3", "2.5"):
            os.environ[key] = v
            same(c(x), fn(x))
    finally:
        os.environ.pop(key, None)


def test_guard_os_getenv():
    key = "KILN_PORT_TEST_GETENV"

    def fn(x):
        v = os.getenv(key)
        return x if v is None else x * len(v)

    c = kiln.compile(fn)
    x = torch.ones(3)
    try:
        os.environ.pop(key, None)
        same(c(x), fn(x))
        os.environ[key] = "abc"
        same(c(x), fn(x))
        os.environ[key] = "abcdef"
        same(c(x), fn(x))
    finally:
        os.environ.pop(key, None)


def test_guard_torch_backends_mkldnn_flag():
    def fn(x):
        if torch.backends.mkldnn.enabled:
            return x + 1
        return x - 1

    c = kiln.compile(fn)
    x = torch.randn(3)
    same(c(x), fn(x))
    with torch.backends.mkldnn.flags(enabled=False):
        same(c(x), fn(x))
    same(c(x), fn(x))


def test_guard_torch_backends_cudnn_flag():
    def fn(x):
        return x * (2 if torch.backends.cudnn.deterministic else 3)

    c = kiln.compile(fn)
    x = torch.randn(3)
    old = torch.backends.cudnn.deterministic
    try:
        for v in (False, True, False):
            torch.backends.cudnn.deterministic = v
            same(c(x), fn(x))
    finally:
        torch.backends.cudnn.deterministic = old


def test_guard_torch_backends_matmul_tf32_flag():
    def fn(x):
        if torch.backends.cuda.matmul.allow_tf32:
            return x * 2
        return x * 3

    c = kiln.compile(fn)
    x = torch.randn(3)
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        for v in (False, True, False):
            torch.backends.cuda.matmul.allow_tf32 = v
            same(c(x), fn(x))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def test_guard_deterministic_algorithms_flag():
    def fn(x):
        return x + (10 if torch.are_deterministic_algorithms_enabled() else 20)

    c = kiln.compile(fn)
    x = torch.zeros(2)
    old = torch.are_deterministic_algorithms_enabled()
    try:
        for v in (False, True, False):
            torch.use_deterministic_algorithms(v)
            same(c(x), fn(x))
    finally:
        torch.use_deterministic_algorithms(old)


def test_guard_default_dtype():
    def fn(x):
        return torch.ones(3) + x, torch.tensor(1.5).dtype

    c = kiln.compile(fn)
    x = torch.zeros(3, dtype=torch.float64)
    same(c(x), fn(x))
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        same(c(x), fn(x))
    finally:
        torch.set_default_dtype(old)
    same(c(x), fn(x))


def test_guard_grad_enabled_read_in_function():
    def fn(x):
        return x + (1 if torch.is_grad_enabled() else 2)

    c = kiln.compile(fn)
    x = torch.zeros(2)
    same(c(x), fn(x))
    with torch.no_grad():
        same(c(x), fn(x))
    with torch.inference_mode():
        same(c(x), fn(x))
    same(c(x), fn(x))


def test_guard_inference_mode_read_in_function():
    def fn(x):
        return x + (1 if torch.is_inference_mode_enabled() else 2)

    c = kiln.compile(fn)
    x = torch.zeros(2)
    same(c(x), fn(x))
    with torch.inference_mode():
        same(c(torch.zeros(2)), fn(torch.zeros(2)))
    same(c(x), fn(x))


def test_guard_num_threads_read_in_function():
    def fn(x):
        return x * torch.get_num_threads()

    c = kiln.compile(fn)
    x = torch.ones(2)
    old = torch.get_num_threads()
    try:
        for n in (1, 2, 1):
            torch.set_num_threads(n)
            same(c(x), fn(x))
    finally:
        torch.set_num_threads(old)


def test_guard_default_argument_replaced():
    def fn(x, scale=2.0):
        return x * scale

    c = kiln.compile(fn)
    x = torch.ones(2)
    same(c(x), fn(x))
    fn.__defaults__ = (5.0,)
    same(c(x), fn(x))
    fn.__defaults__ = (torch.full((2,), 3.0),)
    same(c(x), fn(x))


def test_guard_mutable_default_argument_mutated():
    def fn(x, cfg={"k": 1.0}):  # noqa: B006
        return x * cfg["k"]

    c = kiln.compile(fn)
    x = torch.ones(2)
    same(c(x), fn(x))
    fn.__defaults__[0]["k"] = 4.0
    same(c(x), fn(x))


def test_guard_mutable_default_list_appended_by_the_function():
    def fn(x, acc=[]):  # noqa: B006
        acc.append(1)
        return x * len(acc)

    ref_acc = []

    def ref(x, acc=ref_acc):
        acc.append(1)
        return x * len(acc)

    c = kiln.compile(fn)
    x = torch.ones(2)
    for _ in range(4):
        same(c(x), ref(x))
    assert fn.__defaults__[0] == ref_acc


def test_guard_kwonly_default_replaced():
    def fn(x, *, shift=1.0):
        return x + shift

    c = kiln.compile(fn)
    x = torch.ones(2)
    same(c(x), fn(x))
    fn.__kwdefaults__ = {"shift": -3.0}
    same(c(x), fn(x))


def test_guard_default_of_inlined_callee_replaced():
    def helper(x, k=2):
        return x * k

    def fn(x):
        return helper(x) + 1

    c = kiln.compile(fn)
    x = torch.ones(2)
    same(c(x), fn(x))
    helper.__defaults__ = (7,)
    same(c(x), fn(x))


@pytest.mark.xfail(strict=True, reason="STALE: an inlined function's __code__ replaced between calls is not guarded (TorchDynamo gives eager's result)")
def test_guard_code_of_inlined_callee_replaced():
    def helper(x):
        return x * 2

    def other(x):
        return x * 9

    def fn(x):
        return helper(x) + 1

    c = kiln.compile(fn)
    x = torch.ones(2)
    same(c(x), fn(x))
    orig = helper.__code__
    helper.__code__ = other.__code__
    try:
        same(c(x), fn(x))
    finally:
        helper.__code__ = orig


def test_guard_class_attribute_changed():
    class Cfg:
        factor = 2.0

    obj = Cfg()

    def fn(x, o):
        return x * o.factor

    c = kiln.compile(fn)
    x = torch.ones(2)
    same(c(x, obj), fn(x, obj))
    Cfg.factor = 6.0
    same(c(x, obj), fn(x, obj))
    obj.factor = -1.0  # instance attribute now shadows it
    same(c(x, obj), fn(x, obj))
    del obj.factor
    same(c(x, obj), fn(x, obj))


def test_guard_class_attribute_of_a_global_class():
    class Consts:
        K = 3

    def fn(x):
        return x + Consts.K

    c = kiln.compile(fn)
    x = torch.ones(2)
    for k in (3, 4, 5):
        Consts.K = k
        same(c(x), fn(x))


def test_guard_class_method_replaced():
    class A:
        def f(self, x):
            return x + 1

    a = A()

    def fn(x, obj):
        return obj.f(x)

    c = kiln.compile(fn)
    x = torch.ones(2)
    same(c(x, a), fn(x, a))
    A.f = lambda self, x: x * 10
    same(c(x, a), fn(x, a))


def test_guard_base_class_attribute_changed():
    class Base:
        k = 1.0

    class Child(Base):
        pass

    obj = Child()

    def fn(x, o):
        return x * o.k

    c = kiln.compile(fn)
    x = torch.ones(2)
    same(c(x, obj), fn(x, obj))
    Base.k = 4.0
    same(c(x, obj), fn(x, obj))
    Child.k = 9.0
    same(c(x, obj), fn(x, obj))


def test_guard_object_class_swapped():
    class A:
        def val(self):
            return 1

    class B:
        def val(self):
            return 2

    o = A()

    def fn(x, obj):
        return x * obj.val()

    c = kiln.compile(fn)
    x = torch.ones(2)
    same(c(x, o), fn(x, o))
    o.__class__ = B
    same(c(x, o), fn(x, o))


def test_guard_property_reads_mutable_state():
    class Box:
        def __init__(self):
            self._v = 1.0

        @property
        def v(self):
            return self._v * 2

    b = Box()

    def fn(x, box):
        return x + box.v

    c = kiln.compile(fn)
    x = torch.zeros(2)
    same(c(x, b), fn(x, b))
    b._v = 5.0
    same(c(x, b), fn(x, b))


def test_guard_dataclass_instance_field_changed():
    @dataclasses.dataclass
    class Cfg:
        scale: float = 1.0
        act: str = "relu"

    cfg = Cfg()

    def fn(x, cfg):
        return getattr(torch, cfg.act)(x) * cfg.scale

    c = kiln.compile(fn)
    x = torch.randn(4)
    same(c(x, cfg), fn(x, cfg))
    cfg.scale = 3.0
    same(c(x, cfg), fn(x, cfg))
    cfg.act = "tanh"
    same(c(x, cfg), fn(x, cfg))


@pytest.mark.xfail(strict=True, reason="STALE: a functools.partial argument's keywords dict mutated between calls is not guarded (TorchDynamo gives eager's result)")
def test_guard_functools_partial_keyword_mutated():
    def base(x, k):
        return x * k

    p = functools.partial(base, k=2.0)

    def fn(x, f):
        return f(x)

    c = kiln.compile(fn)
    x = torch.ones(2)
    same(c(x, p), fn(x, p))
    p.keywords["k"] = 5.0
    same(c(x, p), fn(x, p))
    same(c(x, functools.partial(base, k=-1.0)), fn(x, functools.partial(base, k=-1.0)))


def test_guard_enum_member_value_read():
    class Mode(enum.Enum):
        A = 1
        B = 2

    def fn(x, mode):
        if mode is Mode.A:
            return x + 1
        return x * mode.value

    c = kiln.compile(fn)
    x = torch.ones(2)
    for m in (Mode.A, Mode.B, Mode.A):
        same(c(x, m), fn(x, m))


def test_guard_torch_manual_seed_inside():
    def fn(x):
        torch.manual_seed(0)
        return x + torch.rand(3)

    c = kiln.compile(fn)
    x = torch.zeros(3)
    first = c(x)
    torch.rand(5)  # move the generator: the seed inside resets it
    same(c(x), first)
    same(c(x + 1), first + 1)


def test_guard_torch_rng_state_between_calls():
    def fn(x):
        return x + torch.rand(3)

    c = kiln.compile(fn)  # kiln's own draws (test_random_draws.py): reproducible, not eager's values
    x = torch.zeros(3)
    outs = []
    for seed in (1, 2, 1):
        torch.manual_seed(seed)
        outs.append(c(x))
    same(outs[0], outs[2])
    assert not torch.equal(outs[0], outs[1])


def test_guard_tensor_attribute_set_on_input():
    def fn(x):
        return x * getattr(x, "scale", 1.0)

    c = kiln.compile(fn)
    x = torch.ones(2)
    same(c(x), fn(x))
    x.scale = 4.0
    same(c(x), fn(x))
    y = torch.ones(2)
    same(c(y), fn(y))


def test_guard_module_buffer_mutated_outside():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("b", torch.zeros(3))

        def forward(self, x):
            return x + self.b

    m = M()
    c = kiln.compile(m)
    x = torch.ones(3)
    same(c(x), m(x))
    m.b.fill_(2.0)
    same(c(x), m(x))
    m.b = torch.full((3,), 9.0)
    same(c(x), m(x))


def test_guard_parameter_requires_grad_flipped():
    m = nn.Linear(3, 2)
    c = kiln.compile(m)
    x = torch.randn(4, 3)
    out = c(x)
    assert out.requires_grad == m(x).requires_grad
    m.requires_grad_(False)
    out = c(x)
    assert out.requires_grad == m(x).requires_grad is False
    same(out, m(x))
    m.requires_grad_(True)
    assert c(x).requires_grad


def test_guard_sys_module_attribute():
    def fn(x):
        return x + (1 if sys.flags.optimize == 0 else 2) + len(sys.argv[:0])

    same(kiln.compile(fn)(torch.zeros(2)), fn(torch.zeros(2)))


def test_guard_global_dict_via_globals_call():
    def fn(x):
        return x * globals()["g_scale"]

    global g_scale
    c = kiln.compile(fn)
    x = torch.ones(2)
    try:
        for v in (2.0, 3.0):
            g_scale = v
            same(c(x), fn(x))
    finally:
        g_scale = 2.0


def test_guard_numpy_global_array_mutated():
    arr = np.array([1.0, 2.0])

    def fn(x):
        return x * torch.from_numpy(arr).float()

    c = kiln.compile(fn)
    x = torch.ones(2)
    same(c(x), fn(x))
    arr[0] = 10.0
    same(c(x), fn(x))


def test_guard_autocast_state_read():
    def fn(x):
        return x + (1 if torch.is_autocast_enabled("cpu") else 2)

    c = kiln.compile(fn)
    x = torch.zeros(2)
    same(c(x), fn(x))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        same(c(x), fn(x))
    same(c(x), fn(x))


def test_guard_int_object_attribute_used_as_size():
    class Cfg:
        n = 3

    cfg = Cfg()

    def fn(x, cfg):
        return x[: cfg.n].sum() + torch.zeros(cfg.n)

    c = kiln.compile(fn)
    x = torch.randn(10)
    for n in (3, 4, 5, 3, 7):
        cfg.n = n
        same(c(x, cfg), fn(x, cfg))


def test_guard_torch_function_monkeypatched():
    def fn(x):
        return torch.sigmoid(x) + 1

    c = kiln.compile(fn)
    x = torch.randn(3)
    same(c(x), fn(x))
    orig = torch.sigmoid
    torch.sigmoid = lambda t: t * 100
    try:
        same(c(x), fn(x))
    finally:
        torch.sigmoid = orig
    same(c(x), fn(x))


def test_guard_functional_module_attribute_monkeypatched():
    def fn(x):
        return F.gelu(x) * 2

    c = kiln.compile(fn)
    x = torch.randn(3)
    same(c(x), fn(x))
    orig = F.gelu
    F.gelu = torch.tanh
    try:
        same(c(x), fn(x))
    finally:
        F.gelu = orig


@pytest.mark.xfail(strict=True, reason="STALE: m.forward assigned on an nn.Module instance after the first call is not guarded; TorchDynamo gives eager's result")
def test_guard_module_forward_replaced_on_instance():
    m = nn.Linear(3, 3)
    x = torch.randn(2, 3)

    def fn(x):
        return m(x) + 1

    c = kiln.compile(fn)
    with torch.no_grad():
        same(c(x), fn(x))
        m.forward = lambda t: t * 5
        same(c(x), fn(x))


def test_guard_float32_matmul_precision_read():
    def fn(x):
        return x * (1 if torch.get_float32_matmul_precision() == "highest" else 2)

    c = kiln.compile(fn)
    x = torch.ones(2)
    old = torch.get_float32_matmul_precision()
    try:
        for v in ("highest", "high", "highest"):
            torch.set_float32_matmul_precision(v)
            same(c(x), fn(x))
    finally:
        torch.set_float32_matmul_precision(old)


def test_guard_closure_cell_of_an_inlined_callee():
    def make():
        k = [1.0]

        def helper(x):
            return x * k[0]

        def setk(v):
            k[0] = v
        return helper, setk

    helper, setk = make()

    def fn(x):
        return helper(x) + 1

    c = kiln.compile(fn)
    x = torch.ones(2)
    same(c(x), fn(x))
    setk(6.0)
    same(c(x), fn(x))


def test_guard_closure_cell_rebound_of_an_inlined_callee():
    def make():
        k = 1.0

        def helper(x):
            return x * k

        def setk(v):
            nonlocal k
            k = v
        return helper, setk

    helper, setk = make()

    def fn(x):
        return helper(x) + 1

    c = kiln.compile(fn)
    x = torch.ones(2)
    same(c(x), fn(x))
    setk(6.0)
    same(c(x), fn(x))
    setk(torch.full((2,), 3.0))
    same(c(x), fn(x))


def test_guard_instance_dict_written_directly():
    class O:
        pass

    o = O()
    o.k = 1.0

    def fn(x, o):
        return x * o.k

    c = kiln.compile(fn)
    x = torch.ones(2)
    same(c(x, o), fn(x, o))
    o.__dict__["k"] = 4.0
    same(c(x, o), fn(x, o))
    vars(o).update(k=-2.0)
    same(c(x, o), fn(x, o))


def test_guard_nested_attribute_chain_of_a_global():
    global g_object
    g_object = Pair(Pair(1.0, Pair(2.0, 3.0)), 0)

    def fn(x):
        return x * g_object.x.y.y + g_object.x.x

    c = kiln.compile(fn)
    x = torch.ones(2)
    same(c(x), fn(x))
    g_object.x.y.y = 10.0
    same(c(x), fn(x))
    g_object.x.y = Pair(0.0, -1.0)
    same(c(x), fn(x))
    g_object.x = Pair(5.0, Pair(0.0, 0.5))
    same(c(x), fn(x))
    g_object = Pair(1, 1)


def test_guard_slots_attribute_changed():
    class S:
        __slots__ = ("k",)

        def __init__(self):
            self.k = 1.0

    o = S()

    def fn(x, o):
        return x * o.k

    c = kiln.compile(fn)
    x = torch.ones(2)
    same(c(x, o), fn(x, o))
    o.k = 7.0
    same(c(x, o), fn(x, o))


def test_guard_getattr_fallback_reads_state():
    class Lazy:
        def __init__(self):
            self.store = {"k": 1.0}

        def __getattr__(self, name):
            return self.store[name]

    o = Lazy()

    def fn(x, o):
        return x * o.k

    c = kiln.compile(fn)
    x = torch.ones(2)
    same(c(x, o), fn(x, o))
    o.store["k"] = 3.0
    same(c(x, o), fn(x, o))


def test_guard_module_hyperparameter_in_submodule_changed():
    m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.LeakyReLU(0.1))
    m.eval()
    c = kiln.compile(m)
    x = torch.randn(3, 4)
    with torch.no_grad():
        same(c(x), m(x))
        m[2].negative_slope = 0.5
        same(c(x), m(x))
        m[1].p = 0.0
        m.train()
        same(c(x), m(x))  # p=0 dropout in train mode is the identity
        m.eval()


def test_guard_tensor_global_of_another_module_replaced_outside():
    OTHER.g_tensor_export = torch.zeros(10)

    def fn(x):
        return x + OTHER.g_tensor_export

    c = kiln.compile(fn)
    x = torch.randn(10)
    same(c(x), fn(x))
    OTHER.g_tensor_export = torch.ones(10)
    same(c(x), fn(x))
    OTHER.g_tensor_export.mul_(3)
    same(c(x), fn(x))


# ==============================================================================================
# 5. test_python_autograd.py: a pure-Python autograd with a global tape and name counter
# ==============================================================================================

from typing import NamedTuple, Callable, List  # noqa: E402


class Variable:
    def __init__(self, value, name=None):
        self.value = value
        self.name = name or fresh_name()

    @staticmethod
    def constant(value, name=None):
        return Variable(value, name)

    def __mul__(self, rhs):
        return operator_mul(self, rhs)

    def __add__(self, rhs):
        return operator_add(self, rhs)

    def sum(self, name=None):
        return operator_sum(self, name)

    def expand(self, sizes):
        return operator_expand(self, sizes)


class TapeEntry(NamedTuple):
    inputs: List[str]
    outputs: List[str]
    propagate: Callable


gradient_tape: List[TapeEntry] = []


def reset_tape():
    gradient_tape.clear()
    global _name
    _name = 0


def grad(L, desired_results):
    dL_d = {}
    dL_d[L.name] = Variable(torch.ones(()))

    def gather_grad(entries):
        return [dL_d[e] if e in dL_d else None for e in entries]

    for entry in reversed(gradient_tape):
        dL_doutputs = gather_grad(entry.outputs)
        if all(d is None for d in dL_doutputs):
            continue
        dL_dinputs = entry.propagate(dL_doutputs)
        for inp, dL_dinput in zip(entry.inputs, dL_dinputs):
            if inp not in dL_d:
                dL_d[inp] = dL_dinput
            else:
                dL_d[inp].value += dL_dinput.value
    return gather_grad(d.name for d in desired_results)


def operator_mul(self, rhs):
    if isinstance(rhs, float) and rhs == 1.0:
        return self
    r = Variable(self.value * rhs.value)
    inputs = [self.name, rhs.name]
    outputs = [r.name]

    def propagate(dL_doutputs):
        (dL_dr,) = dL_doutputs
        return [dL_dr * rhs, dL_dr * self]

    gradient_tape.append(TapeEntry(inputs=inputs, outputs=outputs, propagate=propagate))
    return r


def operator_add(self, rhs):
    r = Variable(self.value + rhs.value)

    def propagate(dL_doutputs):
        (dL_dr,) = dL_doutputs
        return [dL_dr * 1.0, dL_dr * 1.0]

    gradient_tape.append(TapeEntry(inputs=[self.name, rhs.name], outputs=[r.name], propagate=propagate))
    return r


def operator_sum(self, name):
    r = Variable(torch.sum(self.value), name=name)

    def propagate(dL_doutputs):
        (dL_dr,) = dL_doutputs
        return [dL_dr.expand(*self.value.size())]

    gradient_tape.append(TapeEntry(inputs=[self.name], outputs=[r.name], propagate=propagate))
    return r


def operator_expand(self, sizes):
    assert self.value.dim() == 0
    r = Variable(self.value.expand(sizes))

    def propagate(dL_doutputs):
        (dL_dr,) = dL_doutputs
        return [dL_dr.sum()]

    gradient_tape.append(TapeEntry(inputs=[self.name], outputs=[r.name], propagate=propagate))
    return r


def simple(a, b):
    t = a + b
    return t * b


def _unwrap(v):
    if isinstance(v, Variable):
        return ("Variable", v.name, v.value)
    if isinstance(v, (list, tuple)):
        return type(v)(_unwrap(e) for e in v)
    return v


def _pa_forwards1(a, b):
    a = Variable.constant(a, name="a")
    b = Variable.constant(b, name="b")
    return simple(a, b).sum()


def _pa_forwards2(a, b):
    reset_tape()
    a = Variable.constant(a, name="a")
    b = Variable.constant(b, name="b")
    loss = simple(a, b).sum()
    reset_tape()
    return loss


def _pa_backwards1(a, b):
    a = Variable.constant(a, name="a")
    b = Variable.constant(b, name="b")
    loss = simple(a, b).sum()
    return grad(loss, [a, b])


def _pa_backwards2(a, b):
    reset_tape()
    a = Variable.constant(a, name="a")
    b = Variable.constant(b, name="b")
    loss = simple(a, b).sum()
    res = grad(loss, [a, b])
    reset_tape()
    return res


_PA_FNS = [_pa_forwards1, _pa_forwards2, _pa_backwards1, _pa_backwards2]


@pytest.mark.parametrize("fn", _PA_FNS)
def test_python_autograd_values_and_tape(fn):
    args1 = [torch.randn(10), torch.randn(10)]
    args2 = [torch.randn(10), torch.randn(10)]
    c = kiln.compile(fn)
    reset_tape()
    r1 = _unwrap(c(*args1))
    tape1 = (len(gradient_tape), _name)
    reset_tape()
    r2 = _unwrap(c(*args2))
    tape2 = (len(gradient_tape), _name)
    reset_tape()
    e1 = _unwrap(fn(*args1))
    etape1 = (len(gradient_tape), _name)
    reset_tape()
    e2 = _unwrap(fn(*args2))
    etape2 = (len(gradient_tape), _name)
    reset_tape()
    same(r1, e1)
    same(r2, e2)
    assert tape1 == etape1 and tape2 == etape2, (tape1, etape1, tape2, etape2)


@pytest.mark.parametrize("fn", _PA_FNS)
def test_python_autograd_one_graph(fn):
    kiln.reset()
    c = kiln.compile(fn, fullgraph=True)
    reset_tape()
    try:
        c(torch.randn(10), torch.randn(10))
        reset_tape()
        c(torch.randn(10), torch.randn(10))
    finally:
        reset_tape()
    assert kiln.stats()["graphs_compiled"] == 1, kiln.stats()


def _pa_forward(a, b):
    return simple(a, b).sum()


def test_python_autograd_split_forward_and_grad():
    v1 = Variable.constant(torch.randn(10), name="a")
    v2 = Variable.constant(torch.randn(10), name="b")
    reset_tape()
    loss1 = _pa_forward(v1, v2)
    grad1 = grad(loss1, [v1, v2])
    reset_tape()
    loss2 = kiln.compile(_pa_forward)(v1, v2)
    grad2 = kiln.compile(grad)(loss2, [v1, v2])
    same(_unwrap(loss2), _unwrap(loss1))
    same(_unwrap(grad2), _unwrap(grad1))
    reset_tape()


def test_python_autograd_split_two_graphs():
    v1 = Variable.constant(torch.randn(10), name="a")
    v2 = Variable.constant(torch.randn(10), name="b")
    reset_tape()
    kiln.reset()
    try:
        loss2 = kiln.compile(_pa_forward, fullgraph=True)(v1, v2)
        kiln.compile(grad, fullgraph=True)(loss2, [v1, v2])
    finally:
        reset_tape()
    assert kiln.stats()["graphs_compiled"] <= 2


def test_python_autograd_counts_not_more_than_dynamo():
    def fn(a, b):
        reset_tape()
        a = Variable.constant(a, name="a")
        b = Variable.constant(b, name="b")
        res = grad(simple(a, b).sum(), [a, b])
        reset_tape()
        return [r.value for r in res]

    not_more_than_dynamo(fn, lambda: (torch.randn(10), torch.randn(10)))


# ==============================================================================================
# 6. test_model_output.py: Hugging Face ModelOutput dataclasses
# ==============================================================================================

@needs_hf
def test_hf_pretrained_config_attributes():
    def fn(a, tmp):
        if hasattr(tmp, "somekey"):
            a = a + 1
        if tmp.return_dict:
            return a + torch.ones(2) * tmp.foo_length
        return a

    x = torch.randn(2)
    tmp = PretrainedConfig(return_dict=True, foo_length=20)
    c = kiln.compile(fn, fullgraph=True)
    same(c(x, tmp), fn(x, tmp))
    tmp.foo_length = 7
    same(c(x, tmp), fn(x, tmp))
    tmp.somekey = 1
    same(c(x, tmp), fn(x, tmp))
    tmp.return_dict = False
    same(c(x, tmp), fn(x, tmp))


@needs_hf
def test_hf_mo_create():
    def fn(a, b):
        return BaseModelOutput(a + 1, attentions=b + 3)

    a, b = torch.randn(10), torch.randn(10)
    same(kiln.compile(fn)(a, b), fn(a, b))
    not_more_than_dynamo(fn, lambda: (torch.randn(10), torch.randn(10)))


@needs_hf
def test_hf_mo_assign():
    def fn(a, b):
        tmp = BaseModelOutput(last_hidden_state=b + 3)
        tmp.hidden_states = a + 7
        tmp["attentions"] = a + b + 6
        return tmp

    a, b = torch.randn(10), torch.randn(10)
    same(kiln.compile(fn, fullgraph=True)(a, b), fn(a, b))
    not_more_than_dynamo(fn, lambda: (torch.randn(10), torch.randn(10)))


def _mo_arg():
    return BaseModelOutput(last_hidden_state=torch.randn(10), attentions=torch.randn(10))


def _mo_common(fn, counts=True):
    arg = _mo_arg()
    e_arg = BaseModelOutput(last_hidden_state=arg.last_hidden_state.clone(), attentions=arg.attentions.clone())
    got = kiln.compile(fn)(arg)
    want = fn(e_arg)
    same(got, want)
    same(arg, e_arg)  # in-place updates of the fields as eager's
    if counts:
        not_more_than_dynamo(fn, lambda: (_mo_arg(),))


@needs_hf
def test_hf_mo_getattr():
    def fn(obj):
        x = obj.last_hidden_state * 10
        if obj.hidden_states is not None:
            x += obj.hidden_states
        if obj.attentions is not None:
            x += obj.attentions
        return x

    _mo_common(fn)


@needs_hf
def test_hf_mo_getattr_missing():
    def fn(obj):
        if getattr(obj, "asdf", None) is not None:
            obj.asdf += 1
        return obj.attentions + 1

    _mo_common(fn)


@needs_hf
def test_hf_mo_getitem_and_contains():
    def fn(obj):
        x = obj["last_hidden_state"] * 10
        if "hidden_stats" in obj:
            x += obj["hidden_states"]
        if "attentions" in obj:
            x += obj["attentions"]
        return x

    _mo_common(fn)


@needs_hf
def test_hf_mo_to_tuple():
    def fn(obj):
        a, b = obj.to_tuple()
        return a + b * 10

    _mo_common(fn)


@needs_hf
def test_hf_mo_index():
    def fn(obj):
        return obj[0] * 10 + obj[1]

    _mo_common(fn)


@needs_hf
def test_hf_mo_keys_values_items_len():
    def fn(obj):
        out = 0
        for k, v in obj.items():
            out = out + v * len(k)
        return out, list(obj.keys()), len(obj), len(obj.values())

    _mo_common(fn)


@needs_hf
def _mo_setitem_arg(obj):
    obj.last_hidden_state.mul_(2)
    obj["attentions"] = obj.attentions + 1
    return obj.last_hidden_state.sum()


def _mo_setattr_arg(obj):
    obj.hidden_states = obj.last_hidden_state * 3
    return obj.to_tuple()


@needs_hf
@pytest.mark.parametrize("fn", [_mo_setitem_arg, _mo_setattr_arg])
def test_hf_mo_field_stored_on_the_argument(fn):
    _mo_common(fn, counts=False)


@needs_hf
@pytest.mark.xfail(strict=True, reason="storing a field of a ModelOutput argument (obj[k] = v / obj.k = v) "
                   "breaks the graph 3 times; TorchDynamo: 1 graph, 0 breaks")
@pytest.mark.parametrize("fn", [_mo_setitem_arg, _mo_setattr_arg])
def test_hf_mo_field_stored_on_the_argument_counts(fn):
    not_more_than_dynamo(fn, lambda: (_mo_arg(),))


@needs_hf
def test_hf_mo_dataclass_fields_init():
    @dataclasses.dataclass
    class MyDataClass(ModelOutput):
        a: torch.Tensor
        b: torch.Tensor = None
        c: torch.Tensor = None
        d: torch.Tensor = None
        e: torch.Tensor = None

    def fn(obj):
        class_fields = dataclasses.fields(obj)
        assert len(class_fields)
        assert all(f.default is None for f in class_fields[1:])
        assert not all(getattr(obj, f.name) is None for f in class_fields[1:])
        total = getattr(obj, class_fields[0].name)
        for f in class_fields[1:]:
            v = getattr(obj, f.name)
            if v is not None:
                total += v
        return total

    tensors = [torch.randn(10), torch.randn(10), torch.randn(10)]
    want = fn(MyDataClass(*[t.clone() for t in tensors]))
    got = kiln.compile(fn)(MyDataClass(*[t.clone() for t in tensors]))
    same(got, want)
    not_more_than_dynamo(fn, lambda: (MyDataClass(*[t.clone() for t in tensors]),))


@needs_hf
def test_hf_mo_single_field_post_init():
    @dataclasses.dataclass
    class MyDataClass(ModelOutput):
        x: torch.FloatTensor = None

    def fn(x):
        return MyDataClass(x=x)

    inp = torch.randn(3, 3)
    same(kiln.compile(fn, fullgraph=True)(inp), fn(inp))


@needs_hf
def test_hf_mo_first_field_a_dict_post_init():
    @dataclasses.dataclass
    class Out(ModelOutput):
        a: object = None
        b: torch.Tensor = None

    def fn(x):
        return Out(a={"k": x + 1, "j": x * 2}), Out(a=x, b=x - 1)

    inp = torch.randn(3)
    same(kiln.compile(fn)(inp), fn(inp))


@needs_hf
def test_hf_mo_built_in_a_disabled_function():
    @dataclasses.dataclass
    class MyDataClass(ModelOutput):
        x: torch.FloatTensor = None

    @torch._dynamo.disable(recursive=False)
    def fn(x):
        return MyDataClass(x=x)

    inp = torch.randn(3, 3)
    same(kiln.compile(fn)(inp), fn(inp))


@needs_hf
def test_hf_mo_new_key_set_outside():
    obj = BaseModelOutput()

    def fn(obj):
        return obj["wwww"] + 1

    obj["wwww"] = torch.randn(3, 3)
    c = kiln.compile(fn, fullgraph=True)
    same(c(obj), fn(obj))
    obj["wwww"] = torch.randn(3, 3)
    same(c(obj), fn(obj))


@needs_hf
def test_hf_mo_from_outside_then_field_changed():
    def fn(obj):
        return obj.attentions + 1 if obj.hidden_states is None else obj.attentions + obj.hidden_states

    obj = BaseModelOutput(attentions=torch.randn(3, 3))
    c = kiln.compile(fn, fullgraph=True)
    same(c(obj), fn(obj))
    obj.hidden_states = torch.ones(3, 3)
    same(c(obj), fn(obj))
    obj.attentions = torch.zeros(3, 3)
    same(c(obj), fn(obj))


@needs_hf
def test_hf_bert_style_model_output():
    class Pooler(nn.Module):
        def __init__(self):
            super().__init__()
            self.dense = nn.Linear(32, 32)
            self.activation = nn.Tanh()

        def forward(self, h):
            return self.activation(self.dense(h[:, 0]))

    class Encoder(nn.Module):
        def forward(self, h):
            return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=h, past_key_values=None,
                                                             hidden_states=None, attentions=None,
                                                             cross_attentions=None)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = Encoder()
            self.pooler = Pooler()

        def forward(self, seq):
            enc = self.encoder(seq)
            seq = enc[0]
            pooled = self.pooler(seq) if self.pooler is not None else None
            result = BaseModelOutputWithPoolingAndCrossAttentions(
                last_hidden_state=seq, pooler_output=pooled, past_key_values=enc.past_key_values,
                hidden_states=enc.hidden_states, attentions=enc.attentions, cross_attentions=enc.cross_attentions)
            result.pooler_output = pooled
            result["pooler_output"] = pooled
            return result

    model = Model()
    x = torch.rand(1, 12, 32)
    with torch.no_grad():
        same(kiln.compile(model)(x), model(x))
    model.pooler = None
    with torch.no_grad():
        same(kiln.compile(model)(x), model(x))


@needs_hf
def test_hf_causal_lm_output_index_skips_none():
    class Model(nn.Module):
        def forward(self, x):
            x = x + 1
            return CausalLMOutputWithPast(loss=None, logits=x)[0]

    m = Model()
    x = torch.randn(1, 1, 1, 1)
    same(kiln.compile(m, fullgraph=True)(x), m(x))


@needs_hf
def test_hf_causal_lm_output_returned_with_none_logits():
    class Model(nn.Module):
        def forward(self, x):
            x = x + 1
            return CausalLMOutputWithPast(loss=x, logits=None)

    m = Model()
    x = torch.randn(1, 1, 1, 1)
    got = kiln.compile(m)(x)
    same(got, m(x))
    assert got.to_tuple()[0] is got.loss


@needs_hf
def test_hf_mo_to_tuple_of_a_returned_output_after_update():
    def fn(x):
        out = CausalLMOutputWithPast(logits=x * 2)
        out.loss = out.logits.sum()
        return out.to_tuple(), list(out.keys())

    x = torch.randn(3)
    same(kiln.compile(fn)(x), fn(x))


@needs_hf
def test_hf_mo_setitem_of_a_none_field_raises_like_eager():
    def fn(x):
        out = BaseModelOutput(last_hidden_state=x)
        try:
            out.pop("last_hidden_state")
        except Exception as e:  # ModelOutput forbids pop
            return type(e).__name__, x + 1
        return "none", x

    x = torch.randn(2)
    same(kiln.compile(fn)(x), fn(x))


# --- small dataclass equivalents (no transformers needed) ---

@dataclasses.dataclass
class SimpleOutput:
    logits: torch.Tensor
    loss: torch.Tensor = None
    extra: tuple = ()


def test_dataclass_output_made_and_returned():
    def fn(x):
        out = SimpleOutput(logits=x * 2)
        out.loss = out.logits.mean()
        return out

    x = torch.randn(4)
    got, want = both(fn, x)
    assert type(got) is SimpleOutput
    same(got.logits, want.logits)
    same(got.loss, want.loss)
    assert got.extra == want.extra


def test_dataclass_argument_field_changed_between_calls():
    def fn(o):
        if o.loss is None:
            return o.logits * 2
        return o.logits * 2 + o.loss

    o = SimpleOutput(logits=torch.randn(3))
    c = kiln.compile(fn)
    same(c(o), fn(o))
    o.loss = torch.ones(3)
    same(c(o), fn(o))
    o.loss = None
    same(c(o), fn(o))


def test_dataclass_replace_and_asdict():
    def fn(x):
        out = SimpleOutput(logits=x)
        out2 = dataclasses.replace(out, loss=x.sum())
        return dataclasses.asdict(out2)["loss"], dataclasses.astuple(out)[0] + 1

    x = torch.randn(3)
    same(kiln.compile(fn)(x), fn(x))


def test_frozen_dataclass_assignment_raises():
    @dataclasses.dataclass(frozen=True)
    class F:
        v: torch.Tensor

    def fn(x):
        f = F(x)
        try:
            f.v = x + 1
        except dataclasses.FrozenInstanceError:
            return f.v * 2
        return f.v

    x = torch.randn(3)
    same(kiln.compile(fn)(x), fn(x))
