"""The fuzzer's conditioning rule (tests/python/_fuzz.py, Conditioning): values that eager's own
computation makes ill-conditioned at their inputs (a legitimate last-bit difference of kiln's
kernels amplified past the tolerance) are left uncompared, element by element, and nothing else
is. Small deterministic programs in the shapes of the fuzzer's seeds 1639, 3948, 4049 and 4114,
and well-conditioned ones whose deliberately wrong "kiln" results must still be reported. No
kiln involved: the comparison gets eager's results and a doctored copy."""
import warnings

import pytest
import torch

import _fuzz


@pytest.fixture(autouse=True)
def _tolerances(monkeypatch):
    monkeypatch.setattr(_fuzz, "BACKEND", "inductor")  # floats within TOL, the rule on
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fuzzer's programs warn (std of one element, ...)
        yield


def watched(fn, *inputs):
    """fn's eager result and the Conditioning that watched it."""
    cond = _fuzz.Conditioning()
    with cond:
        out = fn(*inputs)
    assert cond.problems == []
    return out, cond


def check(act, exp, cond):
    """(failure categories, tally) of comparing a "kiln" result with eager's under the rule."""
    fails, tally = [], {"values": 0, "zero_signs": 0, "differed": 0}
    _fuzz.compare(act, exp, "out", fails, True, cond, tally)
    return [f.category for f in fails], tally


def nudged(t, index, by):
    """t with one element moved by `by` (a kiln bug)."""
    t = t.clone()
    t[index] += by
    return t


def test_well_conditioned_wrong_value_is_reported():
    a = torch.tensor([[0.5, -1.25, 2.0], [0.75, 1.5, -0.25]])

    def fn(a):
        s = a.exp().sum(1)               # inexact
        return (s * 3) % 100.0, s > 1.0  # far from every jump of % and >

    (r, gt), cond = watched(fn, a)
    assert not cond.skips(r)[0].any() and not cond.skips(gt)[0].any()
    assert check(r, r, cond) == ([], {"values": 0, "zero_signs": 0, "differed": 0})
    assert check(nudged(r, 1, 1e-2), r, cond)[0] == [_fuzz.VALUE]
    assert check(~gt, gt, cond)[0] == [_fuzz.VALUE]


def test_exact_zero_signs_still_compared():
    # tanh(-0.0) is -0.0 in every libm: an inexact op at an exact operand keeps its zero's sign
    a = torch.tensor([-0.0, 0.0, 1.0])
    r, cond = watched(torch.tanh, a)
    assert not cond.skips(r)[1].any()
    assert check(r.abs(), r, cond)[0] == [_fuzz.SIGNED_ZERO]


def test_remainder_by_a_rounded_square_1639():
    # sqrt(a)**2 is a hair above or below a: a % it is ~0 or ~a
    a = torch.tensor([4.0, 2.0, 7.5, 10.0])
    (t, u), cond = watched(lambda a: (a % torch.square(a.sqrt()), a % 3.0), a)
    assert cond.skips(t)[0].all()
    assert not cond.skips(u)[0].any()
    cats, tally = check(torch.where(t < 1, a, t), t, cond)  # kiln's sqrt rounded the other way
    assert cats == [] and tally["values"] == 4 and tally["differed"] > 0
    assert check(nudged(u, 2, 0.5), u, cond)[0] == [_fuzz.VALUE]  # a % 3.0 is exact: compared


def test_remainder_at_a_multiple_and_cancelling_4049():
    x = torch.tensor([2.0, 1.5, 0.5, 3.0], dtype=torch.float64)

    def fn(x):
        t0 = x * 1                       # exact
        t1 = t0 ** t0                    # one ulp off in kiln, legitimately
        mixed = torch.where(torch.tensor([True, True, True, False]), t1, 6.0)
        return t1 % t0, mixed % t0       # 2**2 % 2 sits at a jump; the others cancel

    (t3, m3), cond = watched(fn, x)
    assert cond.skips(t3)[0].all()
    assert cond.skips(m3)[0].tolist() == [True, True, True, False]  # 6.0 % 3.0 is exact
    assert check(nudged(m3, 3, 1.0), m3, cond)[0] == [_fuzz.VALUE]
    assert check(nudged(m3, 0, 1.0), m3, cond)[0] == []


def test_remainder_of_a_sum_by_one_4114():
    a = torch.tensor([[12.25, -3.5, 40.125, 7.0, 33.3], [1.0, 2.0, 3.0, 4.0, 5.0]])

    def fn(a):
        t0 = a.sum(1, keepdim=True)      # ~89: one ulp is 7.6e-6
        t0[-1] = -2                      # overwritten: exact
        return torch.remainder(t0, True)

    r, cond = watched(fn, a)
    assert cond.skips(r)[0].tolist() == [[True], [False]]
    assert check(nudged(r, (0, 0), 1.5e-5), r, cond)[0] == []
    assert check(nudged(r, (1, 0), 1.0), r, cond)[0] == [_fuzz.VALUE]


def test_sums_of_small_integers_are_exact():
    a = torch.tensor([[1.0, -3.0, 2.0], [4.0, 0.5, -2.5]])
    r, cond = watched(lambda a: a.sum(1) % 2.0, a)  # 0 % 2 and 2 % 2: at jumps, but exact
    assert not cond.skips(r)[0].any()
    assert check(nudged(r, 0, 1.0), r, cond)[0] == [_fuzz.VALUE]


def test_tied_zeros_of_amax_3948():
    x = torch.tensor([[0.0, -0.0, -0.0, 1.0], [-0.0, -0.0, 2.0, 1.0]])
    (m, inv), cond = watched(lambda x: (lambda m: (m, 1 / m))(torch.amax(x, 0)), x)
    ill, zs = cond.skips(m)
    assert not ill.any() and zs.tolist() == [True, False, False, False]  # -0 vs -0 is no tie
    flipped = torch.where(m == 0, -m, m)
    assert check(flipped, m, cond)[0] == [_fuzz.SIGNED_ZERO]             # element 1's sign counts
    flipped[1] = m[1]
    assert check(flipped, m, cond)[0] == []
    assert cond.skips(inv)[0].tolist() == [True, False, False, False]    # 1/x turns the sign into a value
    assert check(nudged(inv, 2, 0.25), inv, cond)[0] == [_fuzz.VALUE]


def test_maximum_ties_and_comparisons():
    a = torch.tensor([0.0, -0.0, 1.0, 2.0])
    b = torch.tensor([-0.0, -0.0, 0.5, 2.0])

    def fn(a, b):
        e = a.exp()                      # exp(2) != 7.389056 exactly: inexact
        return torch.maximum(a, b), e < 7.389056, torch.clamp(a, min=0.0)

    (mx, lt, cl), cond = watched(fn, a, b)
    assert cond.skips(mx)[1].tolist() == [True, False, False, False]
    assert cond.skips(lt)[0].tolist() == [False, False, False, True]
    assert not cond.skips(cl)[1].any()   # clamp with a scalar bound keeps the first operand
    assert check(~lt, lt, cond)[0] == [_fuzz.VALUE]


def test_in_place_through_a_view():
    x = torch.tensor([[10.25, 20.5], [3.0, 4.5]])
    y = torch.tensor([1.7, 2.9])

    def fn(x, y):
        x[0].add_(y.exp().sum())         # row 0 of the input becomes inexact
        return x % 1.0

    r, cond = watched(fn, x, y)
    inex, ill, _ = cond.marks(x)
    assert inex.tolist() == [[True, True], [False, False]] and not ill.any()
    assert cond.skips(r)[0].tolist() == [[True, True], [False, False]]  # 33.9 % 1.0 cancels
    assert check(nudged(x, (0, 0), 1.0), x, cond)[0] == [_fuzz.VALUE]  # a mutated input is compared


def test_unknown_ops_are_problems_not_guesses():
    cond = _fuzz.Conditioning()
    with cond:
        torch.cumsum(torch.ones(3), 0)
    assert any("does not know" in p for p in cond.problems)


def test_passes_eager_through():
    """Eager under the rule gives eager's results and exceptions, bit for bit."""
    def same(x, y):
        if isinstance(x, torch.Tensor):
            return isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape and \
                x.stride() == y.stride() and bool(((x == y) | (x != x) & (y != y)).all()) and \
                (not x.is_floating_point() or bool((x.signbit() == y.signbit()).all()))
        if isinstance(x, (tuple, list)):
            return type(x) is type(y) and len(x) == len(y) and all(same(a, b) for a, b in zip(x, y))
        return x == y

    for seed in range(1, 41):
        prog = _fuzz.generate(seed)
        fn = _fuzz.compile_source(prog.source)
        plain_in, watched_in = _fuzz.make_inputs(prog.inputs, seed, 0), _fuzz.make_inputs(prog.inputs, seed, 0)
        res = []
        for inputs, cond in ((plain_in, None), (watched_in, _fuzz.Conditioning())):
            try:
                if cond is None:
                    res.append(fn(*inputs))
                else:
                    with cond:
                        res.append(fn(*inputs))
                    assert cond.problems == [], (seed, cond.problems)
            except Exception as e:  # noqa: BLE001
                res.append(f"{type(e).__name__}: {e}")
        assert same(res[0], res[1]) and same(plain_in, watched_in), seed


def test_reach_is_small():
    """The rule leaves values uncompared in a few programs only (eager runs of 200 seeds)."""
    n = 0
    for seed in range(1, 201):
        prog = _fuzz.generate(seed)
        fn = _fuzz.compile_source(prog.source)
        cond = _fuzz.Conditioning()
        inputs = _fuzz.make_inputs(prog.inputs, seed, 0)
        try:
            with cond:
                out = fn(*inputs)
        except Exception:  # noqa: BLE001
            continue
        flat = [out] if isinstance(out, torch.Tensor) else [t for t in out if isinstance(t, torch.Tensor)]
        n += any(bool(cond.skips(t)[0].any()) for t in flat + list(inputs))
    assert n <= 10, n
