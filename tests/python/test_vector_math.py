"""kiln's CPU math functions against eager's, over special values (issue 14): ±0, ±inf, nan,
subnormals, huge arguments, the edges of exp's and log's ranges, and a spread of ordinary values,
in an odd-length tensor so that both a kernel's vector loop and its scalar remainder run.

kiln's kernels call glibc's libmvec, else torch's Sleef (eager's own), else kiln's own float
functions (computed in double, rounded once), through one vector entry point per function (so a
value computed twice is the same number: codegen/prelude/cpu_prelude.h); this file runs for the
machine's choice and, in subprocesses, for the other two ($KILN_VECTOR_MATH). Eager calls Sleef
or its own vectorized code. Each function has a stated bound in ULPs (units in the last place) between the
two: libmvec's documented accuracy is 4 ULPs, Sleef's 1, and the bounds below are what the
functions meet (float32 and float64). In float16 and bfloat16 both compute in float32 and round,
so the bound is 1 ULP of the narrow type. Where they differ by more, kiln must be at least as
close as eager to the correctly rounded value (eager's bfloat16 erf gives 0 for erf(1e-8), and
its float32 sqrt is off by one ULP at 1e-8, its log1p of the smallest subnormal is 0: kiln's
results are the right ones there). NaN where eager has NaN, infinities and the signs of zeros
exactly.
"""
import math
import os
import subprocess
import sys

import pytest
import torch

import kiln

# ULPs between kiln and eager, float32 and float64 (libmvec's functions, and what is built on them)
BOUNDS = {"exp": 2, "exp2": 2, "expm1": 2, "log": 4, "log2": 2, "log1p": 2, "sin": 3, "cos": 3, "tan": 3,
          "tanh": 2, "erf": 2, "sigmoid": 4, "sqrt": 1, "rsqrt": 1, "reciprocal": 0}
NARROW_BOUND = 1


def _safe(f):
    def g(v):
        try:
            return f(v)
        except (ValueError, OverflowError, ZeroDivisionError):
            return math.nan
    return g


# The reference: the C library's double-precision functions through Python's math module
REFERENCE = {name: _safe(f) for name, f in {
    "exp": math.exp, "exp2": lambda v: 2.0 ** v, "expm1": math.expm1, "log": math.log, "log2": math.log2,
    "log1p": math.log1p, "sin": math.sin, "cos": math.cos, "tan": math.tan, "tanh": math.tanh, "erf": math.erf,
    "sigmoid": lambda v: 1.0 / (1.0 + math.exp(-v)), "sqrt": math.sqrt, "rsqrt": lambda v: 1.0 / math.sqrt(v),
    "reciprocal": lambda v: 1.0 / v}.items()}


def _inputs(dtype):
    fi = torch.finfo(dtype)
    special = [0.0, -0.0, math.inf, -math.inf, math.nan, fi.tiny, -fi.tiny, fi.smallest_normal / 2,
               -fi.smallest_normal / 4, 1.0, -1.0, 0.5, 2.0, 1e-8, -1e-8, 1e4, -1e4, 1e10, -1e10, 1e30, -1e30,
               fi.max, -fi.max, 88.7, -88.7, 89.0, -104.0, 709.0, -745.0, math.pi, math.pi / 2, -math.pi / 2,
               1e5 * math.pi, 0.999, -0.999, 20.0, -20.0]
    if dtype in (torch.float32, torch.float64):
        special += [1e-45, -1e-45, 5e-324 if dtype == torch.float64 else 1e-40]  # the smallest subnormals
    g = torch.Generator().manual_seed(0)
    spread = [torch.randn(1200, generator=g, dtype=torch.float64) * s for s in (1, 10, 100)]
    spread.append(torch.rand(400, generator=g, dtype=torch.float64) * 2 - 1)
    x = torch.cat([torch.tensor(special, dtype=torch.float64)] + spread).to(dtype)
    return torch.cat([x, x[:7]])


def _ordered(t):
    # the float's bits as an integer that orders like the float (±0 both 0), so that the
    # difference of two is their distance in ULPs
    bits = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
            torch.float64: torch.int64}[t.dtype]
    b = t.view(bits).long() if bits != torch.int64 else t.view(torch.int64)
    low = -(2 ** (8 * t.element_size() - 1))
    return torch.where(b >= 0, b, low - b)


def _ulps(a, b):
    return (_ordered(a) - _ordered(b)).abs()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_math_function_within_its_ulp_bound_of_eager(name, dtype):
    x = _inputs(dtype)
    f = getattr(torch, name)
    before = kiln.stats()["graphs_compiled"], kiln.stats()["eager_fallbacks"]
    got = kiln.compile(lambda t: f(t))(x)
    after = kiln.stats()["graphs_compiled"], kiln.stats()["eager_fallbacks"]
    assert after == (before[0] + 1, before[1]), "not compiled: the comparison would be eager's with itself"
    want = f(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan), f"{name}: NaN at other places than eager's"
    inf = want.isinf() | got.isinf()
    assert torch.equal(got[inf], want[inf]), f"{name}: infinities differ from eager's"
    zeros = (got == 0) & (want == 0)
    assert torch.equal(got[zeros].signbit(), want[zeros].signbit()), f"{name}: signs of zeros differ from eager's"
    finite = ~nan & ~inf & ~zeros
    bound = BOUNDS[name] if dtype in (torch.float32, torch.float64) else NARROW_BOUND
    far = finite.clone()
    far[finite] = _ulps(got[finite], want[finite]) > bound
    # farther from eager than the bound: only where kiln is at least as close as eager to the
    # correctly rounded value (libm's, in double precision, rounded to the dtype)
    if far.any():
        ref = torch.tensor([REFERENCE[name](v) for v in x[far].double().tolist()], dtype=torch.float64).to(dtype)
        worse = _ulps(got[far], ref) > _ulps(want[far], ref)
        bad = x[far][worse]
        assert not worse.any(), (f"{name} {dtype}: {int(worse.sum())} values beyond {bound} ULPs of eager's and "
                                 f"farther than eager's from the rounded value, at {bad[:5].tolist()}")


def test_the_functions_run_in_kiln_kernels_not_torch_calls():
    x = _inputs(torch.float32)
    fn = lambda t: torch.exp(t) + torch.log1p(t.abs()) * torch.erf(t) - torch.tan(t).sigmoid()
    out = kiln.explain(fn)(x)
    assert out.graph_count == 1 and "torch_call" not in out.graphs[0]
    assert any("exp" in k.name for k in out.kernels)


def test_the_chosen_vector_math_library_is_the_one_kernels_call():
    forced = os.environ.get("KILN_VECTOR_MATH")
    assert kiln._C._vector_math() == (forced or kiln._C._vector_math())
    assert kiln._C._vector_math() in ("libmvec", "sleef", "own")


@pytest.mark.skipif(bool(os.environ.get("KILN_VECTOR_MATH")), reason="the run for one library")
@pytest.mark.parametrize("library", ["libmvec", "sleef", "own"])
def test_each_vector_math_library_meets_the_bounds(library, tmp_path):
    # a machine without glibc's libmvec gets Sleef (torch exports it), and one without either
    # kiln's own functions: each is checked here whichever this machine uses by default
    if library == "libmvec" and kiln._C._vector_math() != "libmvec":
        pytest.skip("this machine has no libmvec")
    env = dict(os.environ, KILN_VECTOR_MATH=library, KILN_CACHE_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "failed" not in r.stdout


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_select_over_math_results_keeps_every_bit(dtype):
    # floating selects are bit blends in CPU kernels (kiln_select): -0.0, infinities and NaN
    # payloads come through as the chosen operand has them, and so do the math results
    x = _inputs(dtype)
    cond = torch.rand(x.shape) > 0.5
    fn = lambda c, t: torch.where(c, torch.erf(t), torch.where(t < 0, -t * 0.0, t.exp()))
    out = kiln.explain(fn)(cond, x)
    assert out.graph_count == 1 and "kiln_select" in out.kernels[0].source
    got, want = kiln.compile(fn)(cond, x), fn(cond, x)
    assert torch.equal(got.isnan(), want.isnan())
    ok = ~want.isnan()
    assert torch.equal(got[ok].signbit(), want[ok].signbit())
    bound = BOUNDS["erf"] + BOUNDS["exp"]
    assert (_ulps(got[ok], want[ok]) <= bound).all()
