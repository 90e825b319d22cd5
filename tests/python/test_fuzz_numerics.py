"""Numbers the differential fuzzer found differing from eager in their last bits or special
values (issue 10), pinned down bit for bit: gelu of signed zeros and infinities (torch's float32
gelu of a contiguous tensor goes through a kernel of its own), and float products, which kiln
multiplies in the order torch's CPU kernel does (TensorIterator's order, four vectors of lanes
over contiguous blocks)."""
import math

import pytest
import torch
import torch.nn.functional as F

import kiln
from _helpers import assert_same

FLOATS = [torch.float32, torch.float64]
# torch's CPU product of 16-bit floats multiplies in the 16-bit type (rounding every step), in
# the same vectorized order with twice the lanes: kiln's follows it bit for bit.
PROD_FLOATS = FLOATS + [torch.bfloat16, torch.float16]


def bitwise(fn, *args, special_only=False):
    """kiln's result equals eager's bit for bit (nan equals nan, -0.0 is not 0.0), with one
    compiled graph. `special_only`: bit for bit where eager gives zeros, infinities and NaNs
    (torch's and libm's erf differ in the last bits elsewhere), close everywhere."""
    kiln.reset()
    expected = fn(*args)
    actual = kiln.compile(fn)(*args)
    assert kiln.stats()["graphs_compiled"] == 1 and kiln.stats()["eager_fallbacks"] == 0
    assert_same(actual, expected)
    e, a = expected.detach().reshape(-1), actual.detach().reshape(-1)
    if special_only:
        keep = (e == 0) | ~e.isfinite()
        e, a = e[keep], a[keep]
    same = (a == e) | (a.isnan() & e.isnan())
    assert bool(same.all()), f"{int((~same).sum())}/{e.numel()} differ: kiln {a[~same][:6].tolist()} eager {e[~same][:6].tolist()}"
    assert torch.equal(a.signbit() | a.isnan(), e.signbit() | e.isnan()), f"signs differ: kiln {a} eager {e}"


EDGES = [-0.0, 0.0, math.inf, -math.inf, math.nan, 1e-45, -1e-45, -1e-40, 1e-30, -20.0, -5.5, 5.5, 1.7e38, 2e38, -2e38, 3e38]


def layouts(values, dtype):
    x = torch.tensor(values, dtype=dtype)
    n = x.numel()
    grid = torch.tensor(values * 4, dtype=dtype).view(4, n)
    return {
        "contiguous": x,
        "one element": x[:1].clone(),
        "strided": torch.stack([x, x]).t().reshape(-1)[::2],
        "transposed": grid.t(),
        "offset": torch.cat([x, x])[3:3 + n],
        "expanded": x[:1].expand(5),
    }


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("layout", ["contiguous", "one element", "strided", "transposed", "offset", "expanded"])
def test_gelu_keeps_negative_zero_and_eagers_special_values(approximate, dtype, layout):
    x = layouts(EDGES, dtype)[layout]
    bitwise(lambda x: F.gelu(x, approximate=approximate), x, special_only=True)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_gelu_of_negative_zero_is_negative_zero(approximate, dtype):
    for n in (1, 2, 17, 64):
        x = torch.full((n,), -0.0, dtype=dtype)
        bitwise(lambda x: F.gelu(x, approximate=approximate), x)
        bitwise(lambda x: F.gelu(x * 1.0, approximate=approximate) * 2.0, x)  # fused with its neighbours


def test_gelu_of_inf_in_float32_follows_torchs_kernel_per_layout():
    # torch's own results can differ by layout: its contiguous kernel's form depends on the CPU
    # (NaN for +inf and overflow past 1.7e38 on some, +0.0 for -0.0 on others), its
    # elementwise loop does not. kiln follows each, bit for bit at these values.
    inf = math.inf
    for x in (torch.tensor([inf, 1.0]), torch.tensor([inf, 1.0, 2.0, 3.0])[::2], torch.tensor([inf]),
              torch.tensor([inf, 2e38, -0.0, 1.0]), torch.tensor([-0.0, inf, 0.0, 2e38])[::2]):
        bitwise(lambda t: F.gelu(t), x, special_only=True)


def near_one(*shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return 1 + torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype) * 0.1


@pytest.mark.parametrize("dtype", PROD_FLOATS)
@pytest.mark.parametrize("n", [5, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 257, 1000])
def test_prod_rows_match_eager_bit_for_bit(dtype, n):
    x = near_one(6, n, dtype=dtype)
    bitwise(lambda x: x.prod(-1), x)
    bitwise(lambda x: x.prod(-1, keepdim=True), x)
    bitwise(lambda x: (x * 1.5).prod(1), x)  # a fused prologue: torch multiplies its result's rows
    bitwise(lambda x: x.prod(0), x)
    bitwise(lambda x: x.t().prod(0), x)
    bitwise(lambda x: x[:, ::2].prod(-1), x)
    bitwise(lambda x: x.prod(), x)


@pytest.mark.parametrize("dtype", PROD_FLOATS)
@pytest.mark.parametrize("n", [7, 40, 300])
def test_prod_over_3d_layouts_matches_eager_bit_for_bit(dtype, n):
    y = near_one(3, n, 5, dtype=dtype, seed=n)
    for fn in (lambda y: y.prod(1), lambda y: y.prod(2), lambda y: y.prod(0), lambda y: y.prod(),
               lambda y: y.permute(2, 0, 1).prod(2), lambda y: y.permute(1, 2, 0).prod(),
               lambda y: y.permute(1, 2, 0).prod(1, keepdim=True)):
        bitwise(fn, y)


def test_prod_of_large_factors_overflows_as_eager():
    # Products that overflow in one order and not in another: the order is eager's.
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(4, 96, generator=g) * 40 + 20) * torch.where(torch.rand(4, 96, generator=g) < 0.5, 1.0, 1e-2)
    bitwise(lambda x: x.prod(-1), x)
    bitwise(lambda x: x.prod(-1).int(), x)


def test_prod_of_expanded_input_then_int_matches_eager():
    # fuzz seed 649: a float32 product of five factors, converted to int: off by one ulp (4) before.
    g = torch.Generator().manual_seed(649)
    b = (torch.randn(5, 1, 1, 1, generator=g) * 30).expand(5, 1, 5, 5)
    bitwise(lambda b: b.prod(dim=-4), b)
    assert torch.equal(kiln.compile(lambda b: b.prod(dim=-4).int())(b), b.prod(dim=-4).int())


# A transcendental value kiln recomputes in two loops must be one number, as eager's stored
# tensor is: below, exp is computed in the max pass of log_softmax (a reduction loop) and again
# in its output pass (a vectorized loop whose remainder runs scalar code). libmvec's SIMD exp
# and libm's scalar exp differ in the last bit for some inputs, and with exp of large integers
# one ulp is dozens: log_softmax of 6 equal values came out up to 16 away from -log(6).
@pytest.mark.parametrize("fn_name", ["exp", "tanh", "sin", "log1p", "erf", "sigmoid"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_recomputed_transcendental_is_the_same_number_in_every_loop(fn_name, dtype):
    f = getattr(torch, fn_name)

    def fn(a):
        t0 = f(a)
        return F.log_softmax(t0, 0, dtype=torch.float64), t0 - t0.amax(0)

    for n in (6, 7, 37):
        base = (torch.randn(1, n, n, dtype=dtype) * 30).round().clamp(-80, 80) if fn_name == "exp" else torch.randn(1, n, n, dtype=dtype).abs() * 3
        a = base.expand(6, n, n)  # every slice along dim 0 is the same: each result is exact
        kiln.reset()
        lsm, diff = kiln.compile(fn)(a)
        assert kiln.stats()["eager_fallbacks"] == 0
        assert torch.equal(diff, torch.zeros_like(diff)), f"{fn_name}: recomputed values differ: {diff.abs().max()}"
        torch.testing.assert_close(lsm, fn(a)[0], rtol=1e-12, atol=1e-12)
