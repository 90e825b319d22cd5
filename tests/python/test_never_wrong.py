"""Regression tests for what a differential fuzzer and new users found (issue 10): process
crashes, silently wrong results and exceptions that differed from eager. Each test is named
after the behaviour it pins down; crashes run in a forked child (check(..., isolate=True) and
run_forked), so a regression fails one test instead of killing the session."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from _helpers import assert_same, check, run_forked

INT_MIN = {torch.int32: -2**31, torch.int64: -2**63}
INT_MAX = {torch.int32: 2**31 - 1, torch.int64: 2**63 - 1}


def same_error(fn, *args):
    """kiln raises what eager raises: the same exception type and message."""
    with pytest.raises(Exception) as eager:
        fn(*args)
    with pytest.raises(Exception) as compiled:
        kiln.compile(fn)(*args)
    assert type(compiled.value) is type(eager.value), f"kiln raised {compiled.value!r}, eager {eager.value!r}"
    assert str(compiled.value) == str(eager.value)


def bitwise_equal(actual, expected):
    """Values equal bit for bit: -0.0 is not 0.0, and nan equals nan."""
    assert_same(actual, expected)
    assert torch.equal(actual.signbit(), expected.signbit()), f"sign bits differ: {actual} vs eager {expected}"


# ---- process crashes ----

@pytest.mark.parametrize("reduce", [
    lambda x: x.sum(0), lambda x: x.sum(-1, keepdim=True), lambda x: x.amax(0), lambda x: x.amin(dim=(0,)),
    lambda x: x.mean(0), lambda x: x.prod(0, dtype=torch.float64), lambda x: x.sum(dim=(0,), keepdim=True),
])
def test_reduction_over_dim_0_of_a_0d_tensor_returns_the_scalar(reduce):
    check(reduce, torch.tensor(1.5), isolate=True)


@pytest.mark.parametrize("dim", [0, -1, 1])
def test_size_of_a_dim_of_a_0d_tensor_raises_index_error(dim):
    run_forked(same_error, lambda x: x.size(dim), torch.tensor(1.5))


def test_tensor_dunder_len_is_len():
    check(lambda b: b.__len__() + b, torch.randn(10, 10), isolate=True)
    run_forked(same_error, lambda b: b.__len__(), torch.tensor(2.0))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("op", ["floordiv", "mod"])  # eager's own trunc division traps on it
def test_integer_division_of_int_min_by_minus_one_wraps(dtype, op):
    fn = {"floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b}[op]
    a = torch.tensor([INT_MIN[dtype], 7, -7, INT_MAX[dtype]], dtype=dtype)
    b = torch.tensor([-1, -1, 2, -1], dtype=dtype)
    check(fn, a, b, isolate=True)


def test_meta_tensors_run_eagerly_and_give_meta_results():
    def fn(x):
        return (x * 2 + 1).tanh()

    def body():
        x = torch.randn(3, 4, device="meta")
        out = kiln.compile(fn)(x)
        assert out.device.type == "meta" and out.shape == (3, 4) and out.dtype == torch.float32
        assert kiln.explain(fn)(x).break_reasons, "a meta input must run eagerly, with a reason"
    run_forked(body)


def test_meta_mixed_with_cpu_raises_as_eager():
    run_forked(same_error, lambda x, y: x + y, torch.randn(3, device="meta"), torch.randn(3))


# ---- wrong results ----

def test_integer_pow_with_negative_exponents_follows_torch():
    base = torch.tensor([-2, -1, 0, 1, 2, 3, -1, 1])
    exp = torch.tensor([-1, -1, 1, -5, -1, -2, -3, 0])
    check(lambda a, b: a ** b, base, exp)
    check(lambda x: 2 ** x, torch.tensor([-2, -1, 0, 2, 3]))
    check(lambda x: (-1) ** x, torch.tensor([-3, -2, 0, 1]))


def test_integer_pow_by_a_negative_python_int_raises():
    same_error(lambda x: x ** -1, torch.tensor([1, 2]))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float64])
def test_dot_of_1d_tensors_keeps_their_dtype(dtype):
    check(lambda a, b: a @ b, torch.arange(1, 5, dtype=dtype), torch.arange(2, 6, dtype=dtype))


@pytest.mark.parametrize("fn", [
    lambda x: 1 / x.long(), lambda x: torch.rsqrt(x.int()), lambda x: torch.signbit(x.int().float()),
    lambda x: x.long().float() * -1 + 0 * x, lambda x: x.to(torch.int32).to(torch.float64),
])
def test_no_negative_zero_after_a_float_int_float_round_trip(fn):
    x = torch.tensor([-0.25, 0.25, -0.75, -1.5, 2.5])
    bitwise_equal(kiln.compile(fn)(x.clone()), fn(x.clone()))


def test_copy_into_an_intermediate_keeps_negative_zero():
    def fn(x, src):
        y = x * 1
        y.copy_(src)
        return y
    x, src = torch.zeros(4), torch.tensor([-0.0, 0.0, -1.0, 2.0])
    bitwise_equal(kiln.compile(fn)(x, src), fn(x, src))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("fn", [
    lambda x: (x * 2) // 2, lambda x: (x + 1) > x, lambda x: x + 1, lambda x: -x, lambda x: x * x - 3,
    lambda x: (x - 1) < x,
])
def test_integer_overflow_wraps_around_as_torch(dtype, fn):
    check(fn, torch.tensor([INT_MAX[dtype], INT_MIN[dtype], 0, -1, 12345], dtype=dtype))


def test_plain_subclass_of_tensor_is_not_compiled_as_a_tensor():
    class Scaled(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            out = super().__torch_function__(func, types, args, kwargs or {})
            return out * 2 if func is torch.Tensor.add else out

    def fn(x):
        return (x + 1).relu()

    x = torch.randn(8).as_subclass(Scaled)
    expected, actual = fn(x), kiln.compile(fn)(x)
    assert type(actual) is type(expected)
    torch.testing.assert_close(actual.as_subclass(torch.Tensor), expected.as_subclass(torch.Tensor))
    assert kiln.explain(fn)(x).break_reasons, "a tensor subclass with __torch_function__ must run eagerly"


def test_parameter_inputs_still_compile():
    w = torch.nn.Parameter(torch.randn(4), requires_grad=False)
    check(lambda x: x * 2 + 1, w)


def test_dict_views_are_live():
    def fn(y):
        d = {1: y}
        k, v, it = d.keys(), d.values(), d.items()
        d[4] = y * 2
        total = sum(v)
        return 4 in k, len(v), len(it), total, [key for key in k]
    check(fn, torch.randn(3))


@pytest.mark.parametrize("alpha", [0.5, 1.0, True])
def test_add_of_integer_tensors_with_a_float_or_bool_alpha_raises(alpha):
    same_error(lambda a, b: torch.add(a, b, alpha=alpha), torch.tensor([1, 2]), torch.tensor([3, 4]))


def test_add_of_integer_tensors_with_an_integer_alpha():
    check(lambda a, b: torch.add(a, b, alpha=3), torch.tensor([1, 2]), torch.tensor([3, 4]))


@pytest.mark.parametrize("a,b", [
    (torch.tensor([True, False]), torch.tensor([True, True])),
    (torch.randn(3), torch.tensor([1, 2, 3], dtype=torch.int32)),
    (torch.randn(2, 3), torch.ones(3, 2, dtype=torch.int64)),
    (torch.ones(2, 2, dtype=torch.bool), torch.ones(2, 2, dtype=torch.bool)),
])
def test_matmul_raises_where_torch_has_no_kernel(a, b):
    same_error(lambda x, y: x @ y, a, b)


def test_unary_plus_of_a_bool_tensor_raises():
    same_error(lambda a: +a, torch.tensor([True, False]))


@pytest.mark.parametrize("fn", [lambda a: a.clamp(max=True), lambda a: a.clamp(min=False),
                                lambda a: torch.clamp(a, False, True)])
@pytest.mark.parametrize("shape", [(3,), (4, 0, 4)])
def test_clamp_of_a_bool_tensor_by_bools_raises_empty_or_not(fn, shape):
    # torch's scalar-bound clamp kernels have no bool instance (fuzzer seed 481580)
    same_error(fn, torch.ones(shape, dtype=torch.bool))


@pytest.mark.parametrize("fn", [lambda a: torch.div(a, False, rounding_mode="floor"),
                                lambda a: torch.div(a, True, rounding_mode="trunc"),
                                lambda a: a.div(a, rounding_mode="floor"), lambda a: a // False,
                                lambda a: torch.floor_divide(a, a), lambda a: torch.div(a, 0, rounding_mode="floor")])
def test_rounding_divisions_of_bools_raise_eagers_error_before_a_zero_divisor(fn):
    # torch has no bool kernel for div_floor or div_trunc: that error comes first, a zero divisor
    # is not reached; an int divisor promotes out of bool (fuzzer seed 492453)
    same_error(fn, torch.rand(2, 5) > 0.5)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_nan_and_out_of_range_floats_convert_to_integers_as_eager(dtype):
    # x86's conversion gives the lowest integer; a plain C cast is undefined, and g++ folded it
    # to 0 for the nan a reduction's nan branch makes (fuzzer seed 491173)
    def fn(b):
        m = b.amin(dim=(-1, -2))
        return (m / m).to(dtype), b.to(dtype), (b * 1e30).to(dtype)
    b = torch.randn(5, 5, dtype=torch.float64)
    b[2, 3] = float("nan")
    b[0, 0], b[0, 1] = float("inf"), -float("inf")
    for got, want in zip(kiln.compile(fn)(b), fn(b)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("fn", [lambda a: a.clip(max=1), lambda a: a.clamp(min=0.5), lambda a: a.clamp(0, True)])
def test_clamp_of_a_bool_tensor_by_numbers_promotes_out_of_bool(fn):
    a = torch.rand(6) > 0.5
    got, want = kiln.compile(fn)(a), fn(a)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)


# ---- exceptions that differed ----

@pytest.mark.parametrize("fn", [
    lambda x: x.max(1).values * 2, lambda x: x.min(0).indices + 1, lambda x: x.sort(1).values * 2,
    lambda x: x.topk(2).indices + 1, lambda x: torch.max(x, 1).values - 1, lambda x: x.median(1).values,
    lambda x: x.mode(1).values, lambda x: torch.min(x, dim=-1, keepdim=True)[0],
])
def test_values_and_indices_results_have_named_fields(fn):
    check(fn, torch.randn(3, 4))


@pytest.mark.parametrize("name", ["max", "min", "sort", "topk"])
def test_returned_values_and_indices_keep_their_torch_return_type(name):
    fn = {"max": lambda x: x.max(0), "min": lambda x: torch.min(x, 1), "sort": lambda x: x.sort(),
          "topk": lambda x: x.topk(2)}[name]
    x = torch.randn(3, 4)
    expected, actual = fn(x), kiln.compile(fn)(x)
    assert type(actual) is type(expected)
    assert_same(tuple(actual), tuple(expected))


@pytest.mark.parametrize("fn,args", [
    (lambda a, b: (a & b, a + 1)[1], (torch.randn(3), torch.randn(3))),
    (lambda a: (a // 0, a + 1)[1], (torch.tensor([1, 2]),)),
    (lambda a: (a % 0, a + 1)[1], (torch.tensor([1, 2]),)),
    (lambda a: (F.gelu(a), a + 1)[1], (torch.tensor([1, 2]),)),
    (lambda a, b: (a @ b, a + 1)[1], (torch.tensor([True]), torch.tensor([True]))),
    (lambda a: (F.silu(a), a * 2)[1], (torch.tensor([1, 2]),)),
])
def test_an_unused_result_still_raises_its_error(fn, args):
    same_error(fn, *args)


def test_nested_function_decorated_with_no_grad():
    def fn(x):
        @torch.no_grad()
        def inner(y):
            return y * 2, torch.is_grad_enabled()
        r, enabled = inner(x)
        return r + 1, enabled, torch.is_grad_enabled()
    check(fn, torch.randn(3))


# ---- found by the differential fuzzer (tests/python/_fuzz.py) ----

def test_softmax_of_a_0d_tensor_checks_its_dim():
    same_error(lambda x: torch.softmax(x, 2), torch.tensor(1.0))
    check(lambda x: torch.softmax(x, -1) + F.log_softmax(x, 0), torch.tensor(1.0))


@pytest.mark.parametrize("fn,args", [
    (lambda a: a - 0.0, (torch.tensor([True, False]),)),
    (lambda a: a - False, (torch.randn(3),)),
    (lambda a, b: a - b, (torch.randn(2), torch.tensor([True, False]))),
])
def test_subtraction_with_a_bool_operand_raises(fn, args):
    same_error(fn, *args)


@pytest.mark.parametrize("fn", [lambda x: x.long().float(), lambda x: x.int().double(), lambda x: x.to(torch.int64) * 1.0])
def test_float_int_float_round_trip_of_inf_nan_and_huge_values(fn):
    x = torch.tensor([float("inf"), -float("inf"), float("nan"), 1e20, -1e20, 3e9, -0.75, 2.5])
    bitwise_equal(kiln.compile(fn)(x.clone()), fn(x.clone()))


def test_clamp_minimum_maximum_keep_negative_zero_on_ties():
    x = torch.tensor([-0.0, 0.0, -1.0, 1.0])
    for fn in (lambda t: t.clamp(min=0), lambda t: t.clamp(max=0), lambda t: torch.maximum(t, torch.zeros(4)),
               lambda t: torch.minimum(t, torch.zeros(4)), lambda t: t.clamp(False, 2)):
        bitwise_equal(kiln.compile(fn)(x.clone()), fn(x.clone()))


@pytest.mark.parametrize("fn", [
    lambda x: x + 1, lambda x: (x * 2).relu(), lambda x: x.float(), lambda x: x.clone(), lambda x: torch.atan(x),
    lambda x: torch.where(x > 0, x, -x), lambda x: x.contiguous() * 2,
])
def test_pointwise_results_of_a_transposed_input_keep_eagers_strides(fn):
    x = torch.randn(4, 3, 5).permute(2, 0, 1)
    expected, actual = fn(x), kiln.compile(fn)(x)
    assert_same(actual, expected)
    assert actual.stride() == expected.stride(), f"kiln {actual.stride()} vs eager {expected.stride()}"


# ---- views share memory as in eager ----

def _mutates_through_view(x):
    t = x.view(-1)
    t.fill_(3.0)
    return x + 1


def _whole_slice_then_inplace(x):
    y = x + 0
    v = y[:]
    y.add_(1)
    return v


def _ellipsis_then_inplace(x):
    y = x * 2
    v = y[...]
    v.mul_(3)
    return y


def test_inplace_write_through_a_view_of_an_input_changes_the_input():
    x = torch.randn(3, 4)
    x_eager = x.clone()
    expected = _mutates_through_view(x_eager)
    actual = kiln.compile(_mutates_through_view)(x)
    assert_same(actual, expected)
    assert_same(x, x_eager)


@pytest.mark.parametrize("fn", [_whole_slice_then_inplace, _ellipsis_then_inplace])
def test_whole_tensor_index_is_a_view_that_sees_later_inplace_writes(fn):
    x = torch.randn(5)
    assert_same(kiln.compile(fn)(x.clone()), fn(x.clone()))


@pytest.mark.parametrize("fn", [
    lambda a: a.view(-1), lambda a: a.t()[1:], lambda a: a[0], lambda a: a[:, 1:3].transpose(0, 1),
    lambda a: a.unsqueeze(0).expand(2, 3, 4), lambda a: a[:], lambda a: (a.view(12), a * 2),
])
def test_returned_views_of_an_input_share_its_memory(fn):
    a = torch.randn(3, 4)
    out = kiln.compile(fn)(a)
    view = out[0] if isinstance(out, tuple) else out
    expected = fn(a)
    expected = expected[0] if isinstance(expected, tuple) else expected
    assert view.shape == expected.shape and view.stride() == expected.stride()
    assert view.data_ptr() == expected.data_ptr() and view.storage_offset() == expected.storage_offset()
    if view.stride().count(0) == 0:
        view.add_(1.0)  # the write reaches the caller's tensor, as eager's would
        assert_same(view, fn(a)[0] if isinstance(out, tuple) else fn(a))


def test_returned_view_of_a_result_aliases_that_result():
    def f(x):
        y = x * 2
        return y, y.view(-1), y[...]
    y, v, w = kiln.compile(f)(torch.randn(2, 3))
    y.add_(1)
    assert_same(v, y.view(-1))
    assert_same(w, y)


# ---- modules are matched by what calling them runs, never by class name ----

class GELU(torch.nn.Module):  # timm's own GELU: same name as torch.nn.GELU, no `approximate`
    def forward(self, x):
        return F.gelu(x, approximate="tanh") * 2


class Linear(torch.nn.Module):  # a user class named Linear with other semantics
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        return x @ self.w - 1


class KeepsLinearForward(torch.nn.Linear):
    pass


class OverridesReLU(torch.nn.ReLU):
    def forward(self, x):
        return super().forward(x) + 0.5


@pytest.mark.parametrize("make", [GELU, Linear, lambda: KeepsLinearForward(4, 4), OverridesReLU,
                                  lambda: torch.nn.Sequential(GELU(), Linear(), OverridesReLU())])
def test_modules_are_matched_by_their_forward_not_their_class_name(make):
    m = make().eval()
    with torch.no_grad():
        check(m, torch.randn(3, 4))
        before = kiln.stats()["eager_fallbacks"]
        kiln.compile(m)(torch.randn(3, 4))
        assert kiln.stats()["eager_fallbacks"] == before


# ---- found by the fuzzer: aliasing through reshapes, externs and identity results ----

def _view_of_4d_input_then_inplace(a):
    t0 = a.view(-1)
    t0.add_(1)
    return torch.movedim(a, -3, -4) * 1


def _extern_view_of_sliced_input_then_inplace(a):
    t1 = torch.movedim(a, -1, -1).transpose(0, -1)
    t1.clamp_(max=0)
    return a.view(-1, a.shape[-1]).to(torch.int32)


def _reshape_view_of_result_then_zero(b):
    t2 = torch.clip(b.expand(4, 2, -1, -1, -1), -1, 1.0)
    t3 = t2[0:, ...]
    t4 = t2.view(-1)
    t4.zero_()
    return t3, t4


def _type_as_itself_then_setitem(b):
    t3 = b.sum()
    t6 = t3.type_as(t3)
    t3[None] = False
    return t6


def _twice(make_base, view=lambda t: t):
    """Two equal inputs with the same layout: one for kiln, one for eager."""
    base = make_base()
    return view(base.clone()), view(base.clone())


@pytest.mark.parametrize("fn, inputs", [
    (_view_of_4d_input_then_inplace, lambda: _twice(lambda: torch.randn(2, 3, 4, 5))),
    (_extern_view_of_sliced_input_then_inplace, lambda: _twice(lambda: torch.randn(10, 3) * 3, lambda t: t[::2])),
    (_reshape_view_of_result_then_zero, lambda: _twice(lambda: torch.randn(3, 1, 2), lambda t: t.expand(3, 2, 2))),
    (_type_as_itself_then_setitem, lambda: _twice(lambda: torch.randn(4))),
])
def test_inplace_updates_reach_every_alias(fn, inputs):
    x_kiln, x_eager = inputs()
    assert_same(kiln.compile(fn)(x_kiln), fn(x_eager))
    assert_same(x_kiln, x_eager)


@pytest.mark.parametrize("fn", [lambda x: x.clone(), lambda x: x.to(torch.float64), lambda x: x.to(torch.bool),
                                lambda x: torch.lt(x.to(torch.bool), x)])
def test_copies_of_a_non_dense_input_keep_its_dim_order(fn):
    x = torch.randint(-5, 5, (15, 7, 12, 5))[::3, :, ::3].movedim(2, 0)
    assert kiln.compile(fn)(x).stride() == fn(x).stride()


def test_a_torch_function_that_updates_its_input_in_place_is_not_taken_for_an_identity():
    # F.hardtanh(x, inplace=True) returns x itself, changed; x.type_as(x) returns x unchanged
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU6(inplace=True)).eval()
    with torch.no_grad():
        x = torch.randn(2, 3, 8, 8) * 10
        assert_same(kiln.compile(m)(x), m(x))


def test_expand_of_an_expanded_input_is_not_copied_into_overlapping_memory():
    # fuzz seed 623: an extern view of a stride-0 input keeps its strides; a size-1 dim's stride
    # differing from the plan's is not a different layout
    def fn(a):
        t0 = a[..., None]
        return t0.log(), t0.expand_as(t0) < 0.5
    a = torch.rand(1, 1).expand(1, 2)
    assert_same(kiln.compile(fn)(a), fn(a))


def test_views_handed_over_at_a_break_have_eagers_strides_in_size_1_dims():
    # fuzz seed 3924: t0[None, :] = t0 runs in Python at the break; torch's overlap check reads
    # the stride of t0's size-1 dim, which must be eager's
    def fn(a):
        t0 = a[None]
        t0[None, :] = t0
        return torch.where(t0, 3, a)
    a = torch.rand(2, 6, 2, 6) > 0.5
    a_kiln, a_eager = a.clone(), a.clone()
    assert_same(kiln.compile(fn)(a_kiln), fn(a_eager))
    view = kiln.compile(lambda x: x[None])(a)
    assert view.stride() == a[None].stride()


def test_an_attribute_found_absent_is_guarded():
    # Objects passed in are guarded by type and by what capture read; an attribute hasattr or
    # getattr(..., default) found missing is read too: a new object that has it must not reuse
    # the entry that took the other branch.
    class Cfg:
        pass

    def fn(x, cfg):
        if hasattr(cfg, "scale"):
            return x * cfg.scale
        return x + getattr(cfg, "shift", 1.0)

    cf = kiln.compile(fn)
    plain, scaled, shifted = Cfg(), Cfg(), Cfg()
    scaled.scale = 3.0
    shifted.shift = -2.0
    for cfg in (plain, scaled, shifted, Cfg(), plain):
        x = torch.randn(4)
        torch.testing.assert_close(cf(x, cfg), fn(x, cfg))


class _DoublingDict(dict):
    def __setitem__(self, key, value):
        super().__setitem__(key, value * 2)  # a C method with a tensor: runs at a graph break


def test_a_super_method_run_at_a_graph_break_binds_this_calls_object():
    # The method super() finds is bound to the receiver of each call, never to the object the
    # capture saw (an entry is reused for every object of the type).
    store = kiln.compile(_DoublingDict.__setitem__)
    a, b = _DoublingDict(), _DoublingDict()
    x = torch.randn(3)
    store(a, "k", x)
    store(b, "j", x + 1)
    assert list(a) == ["k"] and list(b) == ["j"]
    torch.testing.assert_close(a["k"], x * 2)
    torch.testing.assert_close(b["j"], (x + 1) * 2)


class _Box:
    def __init__(self, v):
        self.v = v


class _Mapping(dict):
    pass


def test_a_closure_made_before_a_graph_break_closes_over_this_calls_values():
    # The closure is made anew for each call around that call's objects (a function object
    # kept from the capture would keep the first call's box).
    def f(box, x):
        scaled = lambda: box.v * 2  # noqa: E731
        print("", end="")  # a graph break: the closure is handed to the resumed code
        return scaled() + x

    compiled = kiln.compile(f)
    x = torch.randn(3)
    for v in (1.0, 5.0, -2.0):
        torch.testing.assert_close(compiled(_Box(torch.full((3,), v)), x), f(_Box(torch.full((3,), v)), x))


def test_a_bound_method_kept_across_a_graph_break_is_this_calls_objects():
    def f(d, x):
        items = d.items  # a C method bound to the caller's dict
        print("", end="")
        return dict(items())["k"] + x

    compiled = kiln.compile(f)
    x = torch.randn(3)
    for v in (1.0, 7.0):
        d = _Mapping(k=torch.full((3,), v))
        torch.testing.assert_close(compiled(d, x), f(d, x))


def test_two_equal_results_are_two_tensors():
    # b.int() and b.to(torch.int32) compute the same values, but eager makes two tensors: an
    # in-place change of one (here after a graph break, or by the caller) must not show in the
    # other (fuzzer seed 320145: common subexpression elimination had merged them)
    def fn(b):
        t0 = b.int()
        t1 = b.to(t0.dtype)
        t2 = t0.view(-1)
        t2.zero_()
        return t2, t1.contiguous()

    b = torch.randn(3) * 30
    got, want = kiln.compile(fn)(b), fn(b)
    torch.testing.assert_close(got, want)
    x = torch.randn(4)
    u, v = kiln.compile(lambda x: (x * 2, x * 2))(x)
    u.add_(1)
    torch.testing.assert_close(v, x * 2)


@pytest.mark.parametrize("fn", [lambda b: b.contiguous().mT, lambda b: b.contiguous().t()[1:],
                                lambda b: b.reshape(-1), lambda b: b.contiguous().view(3, 2),
                                lambda b: (b.contiguous().mT, b.contiguous())])
def test_a_view_of_a_copy_of_an_input_owns_its_memory(fn):
    # contiguous() of a non-contiguous input is a new tensor in eager: a view of it returned must
    # not read the caller's input in place (kiln returned in0 itself: fuzzer seed 493118)
    b = (torch.randn(3, 2) * 30).t()
    got, want = kiln.compile(fn)(b), fn(b)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        assert_same(g, w)
        assert g.stride() == w.stride()
        assert g.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()


@pytest.fixture
def default_dtype_restored():
    before = torch.get_default_dtype()
    yield
    torch.set_default_dtype(before)


@pytest.mark.parametrize("fn", [
    lambda a: a * 2.5,  # an integer tensor with a Python float: the default dtype
    lambda a: a / 2,  # true division of integers
    lambda a: torch.sigmoid(a),  # a float-only op of integers
    lambda a: a + torch.ones(3),  # a factory without a dtype
    lambda a: a + torch.tensor([0.5, 1.5, 2.5]),
    lambda a: torch.full((3,), 1.5) * a,
    lambda a: a.float() + torch.arange(3.0),  # float32 + float64 factory: default float64 wins
], ids=["int_times_float", "int_true_div", "sigmoid_of_int", "ones", "tensor_literal", "full", "arange"])
@pytest.mark.parametrize("order", [(torch.float32, torch.float64), (torch.float64, torch.float32)])
def test_a_change_of_the_default_dtype_recompiles(fn, order, default_dtype_restored):
    """torch.set_default_dtype between calls: the entry built under the other default is not
    reused (a global guard), and the new capture promotes as torch does under the new default."""
    compiled = kiln.compile(fn)
    for dtype in order + order[:1]:
        torch.set_default_dtype(dtype)
        a = torch.randint(-5, 5, (3,))
        want, got = fn(a), compiled(a)
        assert got.dtype == want.dtype, (dtype, got.dtype, want.dtype)
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("shape", [(0,), (0, 4), (3, 0)])
def test_an_empty_tensor_returned_with_its_stack(shape):
    """stack([t, t]) computes t into the stacked buffer and hands t out as a view of it; for an
    empty t the index arithmetic put that view before the buffer (storage offset -1, fuzz seed
    573143: RuntimeError where eager has none)."""
    def fn(a):
        t = a + 1
        return torch.stack([t, t]), t

    a = torch.zeros(shape)
    got, want = kiln.compile(fn)(a), fn(a)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype


# ---- found by fuzzing Python floats and by TorchDynamo's test_functions.py (eighth session) ----

def test_a_float_guard_tells_minus_zero_from_zero():
    import math

    def fn(x, s):
        return x * math.copysign(1.0, s), s

    cf = kiln.compile(fn)
    x = torch.ones(2)
    for s in [0.5, 0.0, -0.0, 0.0]:
        got, want = cf(x, s), fn(x, s)
        bitwise_equal(got[0], want[0])
        assert math.copysign(1.0, got[1]) == math.copysign(1.0, want[1])


_GLOBAL_SET = {1, 2}


def test_a_global_set_changed_in_place_fails_its_guard():
    def fn(x):
        return x * len(_GLOBAL_SET) + x * (3 in _GLOBAL_SET)

    cf = kiln.compile(fn)
    x = torch.ones(1)
    try:
        assert_same(cf(x), fn(x))
        _GLOBAL_SET.add(3)
        assert_same(cf(x), fn(x))
    finally:
        _GLOBAL_SET.discard(3)


def test_membership_in_a_set_of_tensors_made_at_a_break():
    def fn(a, b):
        s = set([b])  # set() of tensors: a break, its result read by the resume function
        return a in s, b in s, len(s)

    p, q = torch.zeros(5), torch.ones(5)
    cf = kiln.compile(fn)
    assert cf(p, p) == fn(p, p)
    assert cf(p, q) == fn(p, q)


def test_a_class_attribute_read_through_type_of_self_is_guarded():
    class Scaled(torch.nn.Module):
        scale = 0.5

        def forward(self, x):
            return x * type(self).scale + Scaled.scale

    m = Scaled()
    cm = kiln.compile(m)
    x = torch.tensor([1.0, 2.0])
    try:
        for v in [0.5, 0.7, 1.3, -2.0]:
            Scaled.scale = v
            assert_same(cm(x), m(x))
    finally:
        Scaled.scale = 0.5


def test_an_unused_local_at_a_break_does_not_reach_the_backward():
    # the unused (-1.5) ** x is nan and requires grad; handed to the resume function it was a
    # graph output whose zero gradient the backward multiplied by its nan derivative
    def fn(x):
        dead = (-1.5) ** x
        v = x * 10
        print("", end="")
        return v

    x = torch.rand(4, dtype=torch.float64, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    kiln.compile(fn)(x).sum().backward()
    fn(xe).sum().backward()
    assert_same(x.grad, xe.grad)


def test_the_largest_int64_as_an_operand_keeps_its_sign():
    # 2**63 - 1 went through a double (2**63), which int64 wrapped to -2**63
    fn = lambda x, n: x * n  # noqa: E731
    x = torch.tensor([1.5, -0.25, 2.0])
    assert_same(kiln.compile(fn)(x, 2**63 - 1), fn(x, 2**63 - 1))


def test_the_gradient_of_a_power_with_a_python_exponent_is_computed_in_double():
    x = torch.rand(6, dtype=torch.float64) + 0.5
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    kiln.compile(lambda x: x ** -1.3 + 2.5 ** x, dynamic=False)(xa).sum().backward()
    (xb ** -1.3 + 2.5 ** xb).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-14, atol=0)


@pytest.mark.parametrize("edtype", [torch.int64, torch.int32])
def test_the_gradient_of_a_power_with_an_integer_tensor_exponent_subtracts_in_integers(edtype):
    # torch's pow_backward computes exponent - 1 in the exponent's integer dtype (the smallest
    # value wraps to the largest); kiln's float32 e - 1 rounded 2**31 - 1 to an even power and
    # gave inf where eager gives -inf (fuzz_grad seed 622013)
    info = torch.iinfo(edtype)
    e = torch.tensor([info.min, info.max, 0, 1, -1, 2, 3, -3, 2**24 + 1, -(2**24) - 1], dtype=edtype)
    for base in (0.0, 2.0, -1.5, float("inf"), -0.0):
        x = torch.full((e.numel(),), base, dtype=torch.float64)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya = kiln.compile(lambda x, e: x ** e)(xa, e)
        ya.sum().backward()
        (xb ** e).sum().backward()
        assert_same(ya.detach(), (xb ** e).detach())
        torch.testing.assert_close(xa.grad, xb.grad, rtol=0, atol=0, equal_nan=True)


class _Value:
    def __init__(self, value):
        self.value = value

    def __add__(self, other):
        _TAPE.append("add")
        return _Value(self.value + other.value)


_TAPE = []


def test_an_operator_of_a_callers_object_runs_its_python_dunder_once_and_reads_it_each_call():
    # a caller's object's __add__ ran for real at capture: its side effect happened twice, and
    # its result was a constant of the entry that a change of the object's attribute left stale
    def inner(a, b):
        return (a + b).value * 1

    def outer(x, y):
        return inner(_Value(x), _Value(y)).value if False else inner(_Value(x), _Value(y))

    ci = kiln.compile(inner)
    a, b = _Value(torch.ones(2)), _Value(torch.ones(2))
    assert_same(ci(a, b), inner(a, b))
    a.value = torch.zeros(2)
    assert_same(ci(a, b), inner(a, b))
    _TAPE.clear()
    kiln.compile(outer)(torch.ones(2), torch.ones(2))
    assert _TAPE == ["add"]


class _Ranked:
    def __init__(self, v):
        self.v = v

    def __eq__(self, o):
        _TAPE.append("eq")
        return self.v == o.v

    def __lt__(self, o):
        return self.v < o.v

    def __bool__(self):
        return self.v > 0


def test_comparisons_and_truth_of_a_callers_objects_are_read_at_each_call():
    def fn(x, a, b):
        return x * (2 if a == b else 3) + (1 if a < b else 0) + (5 if a else 7) + (1 if a != b else 0)

    cf = kiln.compile(fn)
    a, b, x = _Ranked(1), _Ranked(1), torch.ones(2)
    _TAPE.clear()
    assert_same(cf(x, a, b), fn(x, a, b))
    assert _TAPE.count("eq") == 4  # once per call of each, as eager
    a.v = 0
    assert_same(cf(x, a, b), fn(x, a, b))
    a.v = -3
    assert_same(cf(x, a, b), fn(x, a, b))


def test_a_tensor_made_with_requires_grad_in_the_function_requires_grad():
    fns = [lambda x: torch.ones(2, requires_grad=True) * x, lambda x: torch.tensor([1.0, 2.0], requires_grad=True) * x,
           lambda x: torch.zeros_like(x, requires_grad=True) + x]
    for fn in fns:
        x = torch.ones(2)
        out = kiln.compile(fn)(x)
        assert out.requires_grad
        out.sum().backward()  # eager's leaf: a graph to go back through


def test_a_compiled_function_under_torch_func_transforms():
    cf = kiln.compile(lambda x: (x * 2).sin())
    x = torch.tensor([1.0, 2.0])
    assert_same(torch.func.grad(lambda x: cf(x).sum())(x), torch.func.grad(lambda x: (x * 2).sin().sum())(x))
    y = torch.randn(3, 2)
    assert_same(torch.vmap(cf)(y), (y * 2).sin())


def test_inference_mode_inside_the_function_makes_inference_tensors():
    def fn(x):
        with torch.inference_mode():
            y = x * 2
        return y

    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    out = kiln.compile(fn)(x)
    assert out.is_inference() and fn(x).is_inference()
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        (out * w).sum().backward()


def test_a_nonlocal_write_to_the_callers_variable_reaches_the_caller():
    def outer():
        out = None

        def inlined(a):
            def setter():
                nonlocal out
                out = a + 3
            setter()
            return a

        def handed_out(a):
            def setter():
                nonlocal out
                out = a + 1
            return setter

        return inlined, handed_out, (lambda: out)

    inlined, handed_out, get = outer()
    kiln.compile(inlined)(torch.ones(1))
    assert_same(get(), torch.full((1,), 4.0))
    kiln.compile(handed_out)(torch.ones(1))()
    assert_same(get(), torch.full((1,), 2.0))


def test_isinstance_of_a_parameter_and_of_a_metaclass_with_its_own_check():
    class Meta(type):
        def __instancecheck__(cls, obj):
            return True

    class Anything(metaclass=Meta):
        pass

    def made(x):
        a = torch.nn.Parameter(torch.randn(2))
        return isinstance(a, torch.nn.Parameter), isinstance(x, Anything), isinstance(x, torch.nn.Parameter)

    x = torch.ones(1)
    assert kiln.compile(made)(x) == made(x)
    p = torch.nn.Parameter(torch.ones(2))
    assert kiln.compile(lambda t: isinstance(t, torch.nn.Parameter))(p) is True


@pytest.mark.parametrize("dtype,value", [(torch.uint8, 300), (torch.int8, 128), (torch.float32, 1e39),
                                         (torch.uint8, -1), (torch.float16, 1e6), (torch.int32, 2.5)])
def test_fill_with_a_value_out_of_the_dtypes_range_raises_as_eager(dtype, value):
    # torch converts fill_'s value checked: some values raise, others wrap or round, and a 0-d
    # tensor of one element is filled unchecked (float16's 1e6 raises for three, is inf for one)
    def f(x):
        y = x + 1
        y.fill_(value)
        return y
    for x in (torch.zeros(3, dtype=dtype), torch.zeros((), dtype=dtype), torch.zeros(1, 1, dtype=dtype)):
        try:
            f(x)
        except RuntimeError as e:
            assert "cannot be converted" in str(e)
            with pytest.raises(RuntimeError, match="cannot be converted"):
                kiln.compile(f)(x)
        else:
            check(f, x)


_CL = torch.channels_last
MEMORY_FORMATS = {
    "contiguous_channels_last": lambda x: x.contiguous(memory_format=_CL),
    "to_channels_last": lambda x: x.to(memory_format=_CL),
    "to_float64_channels_last": lambda x: x.to(torch.float64, memory_format=_CL),
    "result_to_channels_last": lambda x: (x + 1).to(memory_format=_CL),
    "and_back": lambda x: x.to(memory_format=_CL).contiguous(memory_format=torch.contiguous_format) * 2,
    "then_viewed": lambda x: x.contiguous(memory_format=_CL).permute(0, 2, 3, 1).view(-1, x.shape[1]),
    "is_contiguous": lambda x: (x.contiguous(memory_format=_CL).is_contiguous(memory_format=_CL),
                                x.is_contiguous(memory_format=_CL)),
    "channels_last_3d": lambda x: x.unsqueeze(2).contiguous(memory_format=torch.channels_last_3d) + 1,
    "three_dims": lambda x: x[0].contiguous(memory_format=_CL),
    "preserve_format": lambda x: x.contiguous(memory_format=torch.preserve_format),
    "positional": lambda x: x.contiguous(_CL),
}


@pytest.mark.parametrize("name", list(MEMORY_FORMATS))
@pytest.mark.parametrize("layout", ["row_major", "channels_last"])
def test_memory_format_arguments_give_eagers_layout(name, layout):
    # Tensor.contiguous(memory_format=...) and Tensor.to(memory_format=...): eager's strides (a
    # stride check in the function, a view after the copy) and eager's errors
    f = MEMORY_FORMATS[name]
    x = torch.randn(2, 3, 4, 5)
    if layout == "channels_last":
        x = x.to(memory_format=_CL)

    def run(g):
        try:
            r = g(x)
        except (RuntimeError, TypeError) as e:
            return type(e)
        return [(t, t.stride()) if isinstance(t, torch.Tensor) else t for t in (r if isinstance(r, tuple) else (r,))]
    expected, got = run(f), run(kiln.compile(f))
    if isinstance(expected, type):
        assert got is expected
        return
    assert len(got) == len(expected)
    for e, g in zip(expected, got):
        if isinstance(e, tuple):
            assert g[1] == e[1]
            torch.testing.assert_close(g[0], e[0], rtol=0, atol=0)
        else:
            assert g == e


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_training_dropout_of_an_integer_tensor_raises_as_eager(dtype):
    f = lambda x: F.dropout(x, p=0.5)  # noqa: E731
    x = torch.ones(2, 3, dtype=dtype)
    with pytest.raises(RuntimeError):
        f(x)
    with pytest.raises(RuntimeError):
        kiln.compile(f)(x)
    g = lambda x: F.dropout(x, p=0.0) + 1  # noqa: E731
    check(g, x.to(torch.int64))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("weight_dtype", ["float32", "same"])
def test_group_norm_of_a_16_bit_input_keeps_its_dtype(dtype, weight_dtype):
    gn = torch.nn.GroupNorm(3, 90).eval().to(torch.float32 if weight_dtype == "float32" else dtype)
    x = torch.randn(2, 90, 6, 6, dtype=dtype)
    with torch.no_grad():
        want, got = gn(x), kiln.compile(gn)(x)
    assert got.dtype == want.dtype == dtype
    torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-2)
