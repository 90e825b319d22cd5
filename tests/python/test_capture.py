"""Tests of kiln's bytecode capture on code written the way models are written.

Each test runs a function or nn.Module through ``kiln.compile`` and compares it with eager
PyTorch on fresh random inputs. Where kiln is expected to capture the code, the test also asks
``kiln.explain`` for exactly one graph and no break reason, so a test cannot pass by quietly
running eagerly. Where the code uses something capture does not handle yet, the test checks
that the call still gives eager's result and that ``break_reasons`` names a reason and a
location in this file (the line of the unsupported construct, marked ``# break: <tag>``).

Module tests run under ``torch.no_grad()`` (parameters require grad; results that require
grad under grad mode compile a backward program too: tests/python/test_training.py).

Known kiln bugs are marked ``xfail(strict=True)`` with ``BUG:`` in their reason.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import math
import os
import re
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kiln

THIS_FILE = os.path.basename(__file__)


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def _fresh_kiln():
    """Each test starts with empty in-memory caches, zeroed counters and a fixed seed."""
    kiln.reset()
    torch.manual_seed(0)
    yield
    kiln.reset()


@pytest.fixture
def no_grad():
    with torch.no_grad():
        yield


def _clone(a):
    if isinstance(a, torch.Tensor):
        return a.clone()
    if isinstance(a, (tuple, list)):
        return type(a)(_clone(v) for v in a)
    return a


def _tensors(a):
    """The tensors in a (nested) argument structure, in order."""
    if isinstance(a, torch.Tensor):
        return [a]
    if isinstance(a, (tuple, list)):
        return [t for v in a for t in _tensors(v)]
    return []


def _why(e) -> str:
    return "; ".join(f"{r['reason']} (at {r['location']})" for r in e.break_reasons) or str(e)


def assert_captured(fn, *args, **kwargs):
    """kiln.explain: one graph, no break."""
    e = kiln.explain(fn)(*_clone(args), **kwargs)
    assert not e.break_reasons, "kiln fell back to eager: " + _why(e)
    assert e.graph_count == 1, f"expected one graph, got {e.graph_count}\n{e}"
    return e


def check(fn, make, *, calls=2, no_recompile=True, compiled=None):
    """fn is captured as one graph; kiln.compile(fn) matches eager on `calls` fresh argument
    tuples from make() (outputs, and inputs after the call); nothing ran eagerly; calls with
    the same layout and Python values reuse the compiled code."""
    args = make()
    assert_captured(fn, *args)
    compiled = compiled or kiln.compile(fn)
    before = kiln.stats()
    first = None
    for i in range(calls):
        if i:
            args = make()
        eager_args, kiln_args = _clone(args), _clone(args)
        expected = fn(*eager_args)
        actual = compiled(*kiln_args)
        torch.testing.assert_close(actual, expected)
        torch.testing.assert_close(_tensors(kiln_args), _tensors(eager_args), msg="inputs after the call differ")
        if i == 0:
            first = kiln.stats()
    after = kiln.stats()
    assert after["eager_fallbacks"] == before["eager_fallbacks"], after["fallback_reasons"]
    if no_recompile:
        assert after["recompiles"] == first["recompiles"], "a call with the same layout recompiled"
    return compiled


_MARKERS: dict[str, int] = {}


def line_of(tag: str) -> int:
    """The line of this file carrying the comment `# break: tag`."""
    if not _MARKERS:
        with open(__file__) as f:
            for no, text in enumerate(f, 1):
                m = re.search(r"# break: (\S+)\s*$", text)
                if m:
                    assert m.group(1) not in _MARKERS, f"marker {m.group(1)} used twice"
                    _MARKERS[m.group(1)] = no
    return _MARKERS[tag]


def assert_falls_back(fn, make, reason, tag=None, *, calls=2):
    """One call is not captured: explain reports no graph, a break reason containing `reason`
    and a location in this file (at the line marked `tag` when given); the compiled function
    still gives eager's outputs and leaves the inputs as eager leaves them."""
    e = kiln.explain(fn)(*_clone(make()))
    assert e.break_reasons, f"no break reason given\n{e}"
    r = e.break_reasons[0]
    assert reason in r["reason"], f"reason {r['reason']!r} does not mention {reason!r}"
    assert THIS_FILE in r["location"], f"location {r['location']!r} is not in {THIS_FILE}"
    if tag is not None:
        assert r["location"].endswith(f"{THIS_FILE}:{line_of(tag)}"), (
            f"location {r['location']!r}, expected line {line_of(tag)} ({tag})")
    compiled = kiln.compile(fn)
    before = kiln.stats()
    for _ in range(calls):
        args = make()
        eager_args, kiln_args = _clone(args), _clone(args)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            actual = compiled(*kiln_args)
        expected = fn(*eager_args)
        torch.testing.assert_close(actual, expected)
        torch.testing.assert_close(_tensors(kiln_args), _tensors(eager_args), msg="inputs after the call differ")
    after = kiln.stats()
    ran_in_python = lambda st: st["eager_fallbacks"] + st["graph_breaks"]  # noqa: E731
    assert ran_in_python(after) > ran_in_python(before) or ran_in_python(before) > 0
    assert any(reason in k for k in after["fallback_reasons"]), after["fallback_reasons"]
    return r


def matches_eager_or_falls_back(fn, make, reason, tag=None):
    """Either kiln captures fn and matches eager, or it runs eagerly with a break reason that
    mentions `reason`, at a location in this file (the line marked `tag` when given); in both
    cases the compiled call matches eager (outputs and inputs after the call). For constructs
    kiln may learn to capture later."""
    e = kiln.explain(fn)(*_clone(make()))
    if e.break_reasons:
        assert e.break_reasons and reason in e.break_reasons[0]["reason"], _why(e)
        loc = e.break_reasons[0]["location"]
        assert THIS_FILE in loc, loc
        if tag is not None:
            assert loc.endswith(f"{THIS_FILE}:{line_of(tag)}"), f"location {loc!r}, expected line {line_of(tag)}"
    else:
        assert not e.break_reasons, _why(e)
    compiled = kiln.compile(fn)
    for _ in range(2):
        args = make()
        eager_args, kiln_args = _clone(args), _clone(args)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            actual = compiled(*kiln_args)
        torch.testing.assert_close(actual, fn(*eager_args))
        torch.testing.assert_close(_tensors(kiln_args), _tensors(eager_args), msg="inputs after the call differ")


def x48():
    return (torch.randn(4, 8),)


def recompiles() -> int:
    return kiln.stats()["recompiles"]


# --------------------------------------------------------------------------------------------
# helper functions: nesting, defaults, keyword-only arguments, *args
# --------------------------------------------------------------------------------------------

def _bias_add(x, b=0.5):
    return x + b


def _scale(x, s=2.0):
    return _bias_add(x * s)


def _norm(x, eps=1e-5):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) * torch.rsqrt(var + eps)


def _block(x, *, k=3.0):
    return _norm(_scale(x, s=k)) + _scale(x)


def nested_helpers(x):
    return torch.tanh(_block(x, k=1.5)) - _block(x)


def test_helpers_nested_four_deep():
    check(nested_helpers, x48)


def _leaky(x, slope=0.01):
    return torch.where(x > 0, x, x * slope)


def defaults_used_and_overridden(x):
    return _leaky(x) + _leaky(x, 0.2) + _leaky(x, slope=0.3)


def test_helper_defaults_used_and_overridden():
    check(defaults_used_and_overridden, x48)


def _affine(x, *, weight, bias=None, scale=1.0):
    y = x * weight
    if bias is not None:
        y = y + bias
    return y * scale


def keyword_only(x, w, b):
    return _affine(x, weight=w) + _affine(x, bias=b, weight=w, scale=0.5)


def test_helper_keyword_only_arguments():
    check(keyword_only, lambda: (torch.randn(4, 8), torch.randn(8), torch.randn(8)))


def _mix(a, b, alpha=0.5, beta=0.5):
    return a * alpha + b * beta


def keywords_out_of_order(x, y):
    return _mix(x, y, beta=0.1, alpha=0.9) - _mix(b=x, a=y)


def test_helper_keywords_out_of_order():
    check(keywords_out_of_order, lambda: (torch.randn(3, 5), torch.randn(3, 5)))


def _sum_all(*tensors, scale=1.0):
    total = tensors[0]
    for t in tensors[1:]:
        total = total + t
    return total * scale


def varargs_helper(a, b, c):
    return _sum_all(a, b, c, scale=0.5) + _sum_all(a) - _sum_all(b, c)


def test_helper_varargs():
    check(varargs_helper, lambda: tuple(torch.randn(2, 6) for _ in range(3)))


def _mixed_signature(x, y, n=2, *rest, negate=False, **unused):
    out = x * n + y
    for r in rest:
        out = out - r
    return -out if negate else out


def mixed_signature(a, b):
    return _mixed_signature(a, b, 3, a, b, negate=True) + _mixed_signature(a, b)


def test_helper_mixed_signature():
    check(mixed_signature, lambda: (torch.randn(4, 4), torch.randn(4, 4)))


def _two_halves(x):
    n = x.shape[-1] // 2
    return x.reshape(x.shape[0], 2, n).sum(dim=1), x.mean(dim=-1, keepdim=True)


def helper_returns_tuple(x):
    a, b = _two_halves(x)
    return a - b


def test_helper_returning_a_tuple_is_unpacked():
    check(helper_returns_tuple, x48)


def _splat_target(a, b, c):
    return a * b + c


def star_call(x, y, z):
    args = (x, y, z)
    return _splat_target(*args)  # break: star-call


def test_helper_called_with_star_args():
    check(star_call, lambda: tuple(torch.randn(3, 3) for _ in range(3)))


def _leaky_relu_default(x, slope=0.1):
    return torch.where(x > 0, x, x * slope)


def uses_default(x):
    return _leaky_relu_default(x) * 2


def test_changing_a_helper_default_recompiles():
    compiled = check(uses_default, x48)
    old = _leaky_relu_default.__defaults__
    try:
        _leaky_relu_default.__defaults__ = (0.5,)
        (x,) = x48()
        torch.testing.assert_close(compiled(x), uses_default(x))
    finally:
        _leaky_relu_default.__defaults__ = old


def _kw_scaled(x, *, alpha=0.1):
    return x * alpha


def uses_kw_default(x):
    return _kw_scaled(x) + 1


def test_changing_a_helper_keyword_default_recompiles():
    compiled = check(uses_kw_default, x48)
    old = _kw_scaled.__kwdefaults__
    try:
        _kw_scaled.__kwdefaults__ = {"alpha": 0.7}
        (x,) = x48()
        torch.testing.assert_close(compiled(x), uses_kw_default(x))
    finally:
        _kw_scaled.__kwdefaults__ = old


class LeakyBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def _act(self, h, slope=0.1):
        return torch.where(h > 0, h, h * slope)

    def forward(self, x):
        return self._act(self.fc(x))


def test_changing_a_module_method_default_recompiles(no_grad):
    model = LeakyBlock()
    compiled = check(model, x48)
    old = LeakyBlock._act.__defaults__
    try:
        LeakyBlock._act.__defaults__ = (0.9,)
        (x,) = x48()
        torch.testing.assert_close(compiled(x), model(x))
    finally:
        LeakyBlock._act.__defaults__ = old


class ForwardingWrapper(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Gated()

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)


def test_module_forwarding_star_args_and_kwargs(no_grad):
    check(ForwardingWrapper(), x48)


def _forward_all(x, *args, **kwargs):
    return _leaky(x, *args, **kwargs)


def forwards_star_args(x):
    return _forward_all(x, 0.2) + _forward_all(x)


def test_helper_forwarding_star_args_and_kwargs():
    check(forwards_star_args, x48)


def _takes_kwargs(x, **options):
    return x * 2


def passes_extra_keyword(x):
    return _takes_kwargs(x, scale=3.0)  # break: kwargs


def test_keyword_into_star_star_kwargs():
    matches_eager_or_falls_back(passes_extra_keyword, x48, "**kwargs", "kwargs")


# --------------------------------------------------------------------------------------------
# lambdas and globals
# --------------------------------------------------------------------------------------------

swish = lambda t: t * torch.sigmoid(t)  # noqa: E731
squared_relu = lambda t: torch.relu(t) ** 2  # noqa: E731


def uses_module_level_lambdas(x):
    return swish(x) + squared_relu(x - 0.5)


def test_module_level_lambdas():
    check(uses_module_level_lambdas, x48)


def apply_activation(x, act):
    return act(x * 2.0) + 1.0


def test_activation_passed_as_argument_recompiles_on_change():
    compiled = check(apply_activation, lambda: (torch.randn(4, 8), swish))
    n = recompiles()
    (x,) = x48()
    torch.testing.assert_close(compiled(x, squared_relu), apply_activation(x, squared_relu))
    torch.testing.assert_close(compiled(x, torch.tanh), apply_activation(x, torch.tanh))
    assert recompiles() == n + 2


RESIDUAL_SCALE = 0.5


def reads_global(x):
    return x + torch.tanh(x) * RESIDUAL_SCALE


def test_global_constant_change_recompiles():
    global RESIDUAL_SCALE
    compiled = check(reads_global, x48)
    n = recompiles()
    try:
        RESIDUAL_SCALE = 2.0
        (x,) = x48()
        torch.testing.assert_close(compiled(x), reads_global(x))
        assert recompiles() == n + 1
    finally:
        RESIDUAL_SCALE = 0.5


# --------------------------------------------------------------------------------------------
# closures
# --------------------------------------------------------------------------------------------

def make_scaled_gelu(scale, shift):
    def scaled_gelu(x):
        return F.gelu(x) * scale + shift
    return scaled_gelu


def test_closure_from_factory():
    check(make_scaled_gelu(1.5, -0.25), x48)


def test_closures_of_two_factories_hold_their_own_values():
    f1, f2 = make_scaled_gelu(2.0, 0.0), make_scaled_gelu(-3.0, 1.0)
    c1, c2 = kiln.compile(f1), kiln.compile(f2)
    for _ in range(2):
        (x,) = x48()
        torch.testing.assert_close(c1(x), f1(x))
        torch.testing.assert_close(c2(x), f2(x))
    assert_captured(f1, *x48())
    assert_captured(f2, *x48())
    assert not torch.allclose(c1(x), c2(x))


_gelu_a = make_scaled_gelu(2.0, 0.5)
_gelu_b = make_scaled_gelu(0.5, -1.0)


def calls_two_closures(x):
    return _gelu_a(x) - _gelu_b(x)


def test_closures_inlined_into_a_caller():
    check(calls_two_closures, x48)


def make_adjustable_scale(value):
    def apply(x):
        return x * value + torch.sin(x)

    def set_value(v):
        nonlocal value
        value = v
    return apply, set_value


def test_closure_cell_change_recompiles():
    apply, set_value = make_adjustable_scale(2.0)
    compiled = check(apply, x48)
    n = recompiles()
    set_value(-4.0)
    (x,) = x48()
    torch.testing.assert_close(compiled(x), apply(x))
    assert recompiles() == n + 1


_inner_apply, _inner_set = make_adjustable_scale(1.0)


def calls_adjustable(x):
    return _inner_apply(x) * 2


def test_closure_cell_change_recompiles_when_inlined():
    compiled = check(calls_adjustable, x48)
    try:
        _inner_set(3.0)
        (x,) = x48()
        torch.testing.assert_close(compiled(x), calls_adjustable(x))
    finally:
        _inner_set(1.0)


def make_bias_adder(bias):
    def add_bias(x):
        return x + bias
    return add_bias


def test_closure_over_a_tensor_reads_its_current_values():
    bias = torch.randn(8)
    add_bias = make_bias_adder(bias)
    compiled = check(add_bias, x48)
    bias.mul_(-3.0)  # updated in place, as an optimizer would
    (x,) = x48()
    torch.testing.assert_close(compiled(x), add_bias(x))


def test_decorated_closure():
    def make(p):
        @kiln.compile
        def f(x):
            return x ** p + p
        return f

    f2, f3 = make(2), make(3)
    (x,) = x48()
    torch.testing.assert_close(f2(x), x ** 2 + 2)
    torch.testing.assert_close(f3(x), x ** 3 + 3)


# --------------------------------------------------------------------------------------------
# recursion
# --------------------------------------------------------------------------------------------

def refine(x, depth):
    if depth == 0:
        return x
    return refine(torch.tanh(x) * 0.9 + 0.1, depth - 1)


def test_recursion_with_constant_depth():
    compiled = check(refine, lambda: (torch.randn(4, 8), 3))
    n = recompiles()
    (x,) = x48()
    torch.testing.assert_close(compiled(x, 5), refine(x, 5))
    assert recompiles() == n + 1


def tree(x, depth):
    if depth == 0:
        return torch.sigmoid(x)
    return tree(x * 0.5, depth - 1) + tree(x + 1.0, depth - 1)


def test_recursion_branching_twice():
    check(tree, lambda: (torch.randn(3, 4), 3))


def count_down(x, depth):
    if depth == 0:
        return x
    return count_down(x + 1, depth - 1)  # break: too-deep


def test_recursion_too_deep_falls_back():
    r = assert_falls_back(count_down, lambda: (torch.randn(4), 40), "deeper than 32", "too-deep")
    assert "count_down" in r["reason"]


# --------------------------------------------------------------------------------------------
# plain Python objects holding configuration
# --------------------------------------------------------------------------------------------

class Config:
    def __init__(self, scale=0.5, activation="gelu", layers=2):
        self.scale = scale
        self.activation = activation
        self.layers = layers

    def post(self, x):
        return x * self.scale + 1.0

    @property
    def double_scale(self):
        return self.scale * 2


CFG = Config()


def reads_config(x):
    for _ in range(CFG.layers):
        x = (F.gelu(x) if CFG.activation == "gelu" else torch.relu(x)) * CFG.scale + x
    return x


def test_config_object_attributes_recompile_on_change():
    compiled = check(reads_config, x48)
    n = recompiles()
    try:
        for attr, value in (("scale", 2.0), ("activation", "relu"), ("layers", 3)):
            setattr(CFG, attr, value)
            (x,) = x48()
            torch.testing.assert_close(compiled(x), reads_config(x))
            torch.testing.assert_close(compiled(x), reads_config(x))
        assert recompiles() == n + 3
    finally:
        CFG.scale, CFG.activation, CFG.layers = 0.5, "gelu", 2


def config_as_argument(x, cfg):
    return x * cfg.double_scale - cfg.scale


def test_config_object_as_argument_with_property():
    cfg = Config(scale=0.25)
    compiled = check(config_as_argument, lambda: (torch.randn(4, 8), cfg))
    n = recompiles()
    cfg.scale = 4.0
    (x,) = x48()
    torch.testing.assert_close(compiled(x, cfg), config_as_argument(x, cfg))
    other = Config(scale=-1.0)
    torch.testing.assert_close(compiled(x, other), config_as_argument(x, other))
    # the scale changed once: the recompiled entry reads it at each call (test_dynamic_floats)
    assert recompiles() == n + 1


def calls_config_method(x):
    return CFG.post(x) * 2


def test_config_object_method_is_captured():
    check(calls_config_method, x48)


def test_config_object_method_does_not_recompile_each_call():
    compiled = kiln.compile(calls_config_method)
    for _ in range(10):
        (x,) = x48()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.testing.assert_close(compiled(x), calls_config_method(x))
    s = kiln.stats()
    assert s["recompiles"] == 0 and s["eager_fallbacks"] == 0, s


class Mode(enum.Enum):
    FAST = 1
    PRECISE = 2


@dataclasses.dataclass
class RunConfig:
    mode: Mode = Mode.FAST
    scale: float = 2.0

    def once(self, t):
        return t * self.scale

    def twice(self, t):
        return self.once(self.once(t))


RUN = RunConfig()


def uses_dataclass_and_enum(x):
    y = RUN.twice(x)
    if RUN.mode == Mode.FAST:
        return torch.tanh(y)
    return y / (1 + y.abs())


def test_dataclass_config_with_enum_branch_recompiles_on_change():
    compiled = check(uses_dataclass_and_enum, x48)
    try:
        RUN.mode = Mode.PRECISE
        (x,) = x48()
        torch.testing.assert_close(compiled(x), uses_dataclass_and_enum(x))
        RUN.scale = -0.5
        torch.testing.assert_close(compiled(x), uses_dataclass_and_enum(x))
    finally:
        RUN.mode, RUN.scale = Mode.FAST, 2.0


DEFAULTS = {"scale": 2.0, "eps": 1e-5}


def reads_config_dict(x):
    return x * DEFAULTS["scale"] / (x.abs() + DEFAULTS["eps"])


def test_config_dict_value_change_recompiles():
    compiled = check(reads_config_dict, x48)
    try:
        DEFAULTS["scale"] = 5.0
        (x,) = x48()
        torch.testing.assert_close(compiled(x), reads_config_dict(x))
    finally:
        DEFAULTS["scale"] = 2.0


class DictConfigured(nn.Module):
    def __init__(self):
        super().__init__()
        self.opts = {"scale": 0.5}
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x) * self.opts["scale"]


def test_module_dict_attribute_change_recompiles(no_grad):
    model = DictConfigured()
    compiled = check(model, x48)
    model.opts["scale"] = 3.0
    (x,) = x48()
    torch.testing.assert_close(compiled(x), model(x))


# --------------------------------------------------------------------------------------------
# custom nn.Modules
# --------------------------------------------------------------------------------------------

class MLPBlock(nn.Module):
    def __init__(self, dim=8, hidden=16, cfg=None):
        super().__init__()
        self.cfg = cfg or Config()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(0.1)

    def _act(self, h):
        return F.gelu(h) if self.cfg.activation == "gelu" else torch.relu(h)

    def forward(self, x):
        h = self.fc2(self._act(self.fc1(x)))
        return x + self.drop(h) * self.cfg.scale


def test_custom_module_with_submodules_and_helper_method(no_grad):
    check(MLPBlock().eval(), x48)


def test_module_config_object_change_recompiles(no_grad):
    cfg = Config()
    model = MLPBlock(cfg=cfg).eval()
    compiled = check(model, x48)
    n = recompiles()
    cfg.activation = "relu"
    (x,) = x48()
    torch.testing.assert_close(compiled(x), model(x))
    cfg.scale = 3.0
    torch.testing.assert_close(compiled(x), model(x))
    assert recompiles() == n + 2


class Residual(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.act = nn.Tanh()

    def forward(self, x):
        return x + self.act(self.fc(x))


class Stack(nn.Module):
    def __init__(self, depth=3, dim=8):
        super().__init__()
        self.blocks = nn.ModuleList([Residual(dim) for _ in range(depth)])
        self.head = nn.Sequential(nn.Linear(dim, 16), nn.GELU(), nn.Linear(16, 4))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_module_list_loop(no_grad):
    check(Stack(), x48)


def test_sequential_of_custom_modules(no_grad):
    model = nn.Sequential(Residual(), nn.ReLU(), MLPBlock().eval(), Residual(), nn.Sigmoid())
    check(model, x48)


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(Residual(), nn.Sequential(Residual(), nn.Tanh()), Stack(depth=2))

    def forward(self, x):
        return self.body(x).softmax(dim=-1)


def test_nested_sequentials_and_module_lists(no_grad):
    check(Nested(), x48)


class Gated(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.value = nn.Linear(dim, dim)
        self.gate = nn.Linear(dim, dim, bias=False)

    def forward(self, x, *, scale=1.0, residual=None):
        y = self.value(x) * torch.sigmoid(self.gate(x)) * scale
        if residual is not None:
            y = y + residual
        return y


class UsesGated(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Gated()

    def forward(self, x):
        return self.inner(x, scale=0.5, residual=x) + self.inner(x)


def test_submodule_called_with_keywords(no_grad):
    check(UsesGated(), x48)


def test_compiled_module_called_with_keywords(no_grad):
    model = Gated()
    compiled = kiln.compile(model)
    x, r = torch.randn(4, 8), torch.randn(4, 8)
    assert_captured(model, x, scale=2.0, residual=r)
    torch.testing.assert_close(compiled(x, scale=2.0, residual=r), model(x, scale=2.0, residual=r))
    torch.testing.assert_close(compiled(x), model(x))
    assert kiln.stats()["eager_fallbacks"] == 0


class TrainEvalBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        if self.training:
            y = y * 0.5 + 1.0
        else:
            y = torch.tanh(y)
        return y


def test_training_flag_branch_follows_train_and_eval(no_grad):
    model = TrainEvalBranch()
    compiled = check(model, x48)  # training mode
    n = recompiles()
    for mode in (False, True, False):
        model.train(mode)
        (x,) = x48()
        torch.testing.assert_close(compiled(x), model(x))
    assert recompiles() >= n + 1
    model.eval()
    assert_captured(model, *x48())


def test_dropout_is_captured_in_eval_and_in_training_mode(no_grad):
    model = MLPBlock().eval()
    assert_captured(model, *x48())
    model.train()
    # training-mode dropout is a node of the graph (masks from kiln's generator: test_training.py)
    e = kiln.explain(model)(*x48())
    assert e.graph_count == 1 and e.graph_break_count == 0, e.break_reasons


class ScaledRepeat(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 0.5
        self.repeats = 2
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        for _ in range(self.repeats):
            x = self.fc(x) * self.scale
        return x


def test_module_attribute_change_counts_a_recompile(no_grad):
    model = ScaledRepeat()
    compiled = kiln.compile(model)
    kiln.reset()
    (x,) = x48()
    torch.testing.assert_close(compiled(x), model(x))
    torch.testing.assert_close(compiled(x), model(x))
    assert kiln.stats()["recompiles"] == 0
    model.scale = 3.0
    torch.testing.assert_close(compiled(x), model(x))
    assert kiln.stats()["recompiles"] == 1
    model.repeats = 4
    torch.testing.assert_close(compiled(x), model(x))
    assert kiln.stats()["recompiles"] == 2
    assert kiln.stats()["eager_fallbacks"] == 0


def test_parameters_are_read_at_each_call(no_grad):
    model = Stack()
    compiled = check(model, x48)
    n = recompiles()
    (x,) = x48()
    model.blocks[1].fc.weight.mul_(-2.0)  # an optimizer step
    model.head[0].bias.add_(1.0)
    torch.testing.assert_close(compiled(x), model(x))
    model.head[2].weight = nn.Parameter(torch.randn(4, 16))  # replaced by a new tensor
    torch.testing.assert_close(compiled(x), model(x))
    assert recompiles() == n
    assert kiln.stats()["eager_fallbacks"] == 0


class MaybeBias(nn.Module):
    def __init__(self, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 6))
        self.bias = nn.Parameter(torch.randn(6)) if bias else None

    def forward(self, x):
        y = x @ self.weight
        if self.bias is not None:
            y = y + self.bias
        return y


@pytest.mark.parametrize("bias", [True, False])
def test_module_bias_is_not_none(no_grad, bias):
    check(MaybeBias(bias), x48)


def test_linear_without_bias(no_grad):
    check(nn.Sequential(nn.Linear(8, 5, bias=False), nn.ReLU()), x48)


class WithStaticHelper(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    @staticmethod
    def act(t):
        return t * torch.sigmoid(1.702 * t)

    def forward(self, x):
        return self.act(self.fc(x))


def test_module_staticmethod(no_grad):
    check(WithStaticHelper(), x48)


class WithActivation(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = act

    def forward(self, x):
        return self.act(self.fc(x))


def test_module_holding_a_lambda_or_closure(no_grad):
    model = WithActivation(swish)
    compiled = check(model, x48)
    model.act = make_scaled_gelu(0.5, 0.1)
    (x,) = x48()
    torch.testing.assert_close(compiled(x), model(x))
    model.act = make_scaled_gelu(-2.0, 0.0)
    torch.testing.assert_close(compiled(x), model(x))
    assert kiln.stats()["eager_fallbacks"] == 0


class WithConfigMethod(nn.Module):
    def __init__(self):
        super().__init__()
        self.cfg = Config(scale=0.3)
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.cfg.post(self.fc(x))


def test_module_calls_config_object_method(no_grad):
    check(WithConfigMethod(), x48)


class Attention(nn.Module):
    def __init__(self, dim=16, heads=4):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    @property
    def head_dim(self):
        return self.q.in_features // self.heads

    def _split(self, t):
        b, n, _ = t.shape
        return t.reshape(b, n, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        scores = q @ k.transpose(-2, -1) / self.head_dim ** 0.5
        out = scores.softmax(dim=-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


def test_attention_block_with_shape_arithmetic(no_grad):
    check(Attention(), lambda: (torch.randn(2, 5, 16),))


def test_many_instances_of_one_class_do_not_share_a_cache_limit(no_grad):
    models = [Residual() for _ in range(10)]
    compiled = [kiln.compile(m) for m in models]
    (x,) = x48()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "recompiled too often" warning
        for m, c in zip(models, compiled):
            torch.testing.assert_close(c(x), m(x))
    assert kiln.stats()["eager_fallbacks"] == 0


def test_module_parameters_requiring_grad_compile_with_a_backward_under_grad_mode():
    model = Residual()
    (x,) = x48()
    e = kiln.explain(model)(x)
    assert e.graph_count == 1 and e.graph_break_count == 0 and len(e.backward_graphs) == 1
    out = kiln.compile(model)(x)
    torch.testing.assert_close(out, model(x))
    assert out.grad_fn.name() == "CompiledFunctionBackward"


class IndexedLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])

    def forward(self, x):
        for i in range(len(self.layers)):
            x = torch.relu(self.layers[i](x))
        return x


def test_module_list_indexed_loop(no_grad):
    check(IndexedLayers(), x48)


class InplaceReluReuse(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        h = self.fc(x)
        a = self.act(h)  # eager: h itself is now relu(h)
        return h + a


def test_inplace_relu_module_on_reused_tensor(no_grad):
    check(InplaceReluReuse(), x48)


class InplaceReluOnInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.ReLU(inplace=True)
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(self.act(x))  # break: relu-input


def test_inplace_relu_module_on_input_is_written_back(no_grad):
    check(InplaceReluOnInput(), x48)


class LastLayerOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])

    def forward(self, x):
        return self.layers[-1](x)


def test_module_list_constant_index(no_grad):
    check(LastLayerOnly(), x48)


class Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.fc(x))


class CallsBaseExplicitly(Base):
    def forward(self, x):
        return Base.forward(self, x) * 2 + x


def test_base_class_forward_called_explicitly(no_grad):
    check(CallsBaseExplicitly(), x48)


class CallsSuper(Base):
    def forward(self, x):
        return super().forward(x) * 2 + x  # break: super


def test_super_forward(no_grad):
    matches_eager_or_falls_back(CallsSuper(), x48, "super", "super")


class Combine(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def combine(self, *parts, weight=1.0):
        out = parts[0]
        for p in parts[1:]:
            out = out + p
        return out * weight

    def forward(self, a, b):
        return self.proj(self.combine(a, b, a * b, weight=0.5))


def test_module_method_with_varargs(no_grad):
    check(Combine(), lambda: (torch.randn(4, 8), torch.randn(4, 8)))


def test_module_bias_assigned_after_compile_recompiles(no_grad):
    model = MaybeBias(bias=False)
    compiled = check(model, x48)
    n = recompiles()
    model.bias = nn.Parameter(torch.randn(6))
    (x,) = x48()
    torch.testing.assert_close(compiled(x), model(x))
    assert recompiles() == n + 1


class Regroup(nn.Module):
    def __init__(self):
        super().__init__()
        self.groups = (2, 16)

    def forward(self, x):
        return x.reshape(self.groups).softmax(dim=-1) * len(self.groups)


def test_module_tuple_attribute_change_recompiles(no_grad):
    model = Regroup()
    compiled = check(model, x48)
    n = recompiles()
    model.groups = (8, 4)
    (x,) = x48()
    torch.testing.assert_close(compiled(x), model(x))
    assert recompiles() == n + 1


class Hooked(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x) * 2


def test_forward_hooks_on_a_submodule_are_captured(no_grad):
    model = Hooked()
    model.fc.register_forward_pre_hook(lambda mod, inputs: (inputs[0] * 3,))
    handle = model.fc.register_forward_hook(lambda mod, inputs, out: out - inputs[0])
    compiled = check(model, x48)
    handle.remove()  # guarded: the next call recompiles without the hook
    (x,) = x48()
    torch.testing.assert_close(compiled(x), model(x))


def test_forward_hook_on_the_compiled_module_itself(no_grad):
    model = Hooked()
    compiled = kiln.compile(model)
    (x,) = x48()
    torch.testing.assert_close(compiled(x), model(x))
    model.register_forward_hook(lambda mod, inputs, out: out.relu())
    torch.testing.assert_close(compiled(x), model(x))


ENCODER = nn.Linear(8, 8)


def uses_global_module(x):
    return torch.tanh(ENCODER(x)) + 1


def make_head(module):
    def head(x):
        return module(x).softmax(dim=-1)
    return head


def test_global_and_closure_modules_read_current_parameters(no_grad):
    compiled = check(uses_global_module, x48)
    head = make_head(nn.Linear(8, 3))
    compiled_head = check(head, x48)
    ENCODER.weight.mul_(0.5)
    (x,) = x48()
    torch.testing.assert_close(compiled(x), uses_global_module(x))
    torch.testing.assert_close(compiled_head(x), head(x))


def test_compile_a_bound_method_of_a_config_object():
    cfg = Config(scale=1.5)
    compiled = kiln.compile(cfg.post)
    (x,) = x48()
    assert_captured(cfg.post, x)
    torch.testing.assert_close(compiled(x), cfg.post(x))
    cfg.scale = -2.0
    torch.testing.assert_close(compiled(x), cfg.post(x))
    assert kiln.stats()["recompiles"] == 1


class TypeChecks(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU()

    def forward(self, x):
        if isinstance(self.act, nn.ReLU):  # break: isinstance-module
            x = x * 2
        return self.act(self.fc(x))


def test_isinstance_of_a_submodule(no_grad):
    matches_eager_or_falls_back(TypeChecks(), x48, "", "isinstance-module")


class FunctionList(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.activations = [torch.relu, torch.tanh, swish]

    def forward(self, x):
        for act in self.activations:
            x = act(self.fc(x))
        return x


def test_plain_list_of_functions_as_module_attribute(no_grad):
    check(FunctionList(), x48)


def test_replacing_a_submodule_recompiles(no_grad):
    model = Stack(depth=2)
    compiled = check(model, x48)
    n = recompiles()
    model.head = nn.Sequential(nn.Linear(8, 3), nn.Sigmoid())
    (x,) = x48()
    torch.testing.assert_close(compiled(x), model(x))
    model.blocks[0].act = nn.Identity()
    torch.testing.assert_close(compiled(x), model(x))
    assert recompiles() == n + 2


def test_appending_to_a_module_list_recompiles(no_grad):
    model = Stack(depth=1)
    compiled = check(model, x48)
    n = recompiles()
    model.blocks.append(Residual())
    (x,) = x48()
    torch.testing.assert_close(compiled(x), model(x))
    assert recompiles() == n + 1


# --------------------------------------------------------------------------------------------
# branches on values known at capture time
# --------------------------------------------------------------------------------------------

def linear_maybe_bias(x, w, bias=None):
    y = x @ w
    if bias is not None:
        y = y + bias
    return y


def test_if_bias_is_not_none():
    check(linear_maybe_bias, lambda: (torch.randn(4, 8), torch.randn(8, 3), torch.randn(3)))
    check(linear_maybe_bias, lambda: (torch.randn(4, 8), torch.randn(8, 3), None))


def test_bias_none_and_tensor_through_one_compiled_function():
    compiled = kiln.compile(linear_maybe_bias)
    for _ in range(2):
        x, w, b = torch.randn(4, 8), torch.randn(8, 3), torch.randn(3)
        torch.testing.assert_close(compiled(x, w), linear_maybe_bias(x, w))
        torch.testing.assert_close(compiled(x, w, b), linear_maybe_bias(x, w, b))
    assert kiln.stats()["recompiles"] == 1
    assert kiln.stats()["eager_fallbacks"] == 0


def branch_on_shape(x):
    if x.shape[-1] > 4:
        return x.sum(dim=-1)
    return x.mean(dim=-1) * 3


def test_branch_on_shape():
    compiled = check(branch_on_shape, x48)
    y = torch.randn(4, 3)
    torch.testing.assert_close(compiled(y), branch_on_shape(y))


def flagged(x, use_tanh: bool, mode: str = "relu"):
    y = torch.tanh(x) if use_tanh else x * 2
    if mode in ("relu", "leaky"):
        y = torch.relu(y)
    elif mode == "gelu":
        y = F.gelu(y, approximate="tanh")
    return y


def test_branch_on_bool_and_string_arguments():
    compiled = check(flagged, lambda: (torch.randn(4, 8), True))
    (x,) = x48()
    for args in ((False,), (True, "gelu"), (False, "none")):
        torch.testing.assert_close(compiled(x, *args), flagged(x, *args))
    assert kiln.stats()["eager_fallbacks"] == 0


def isinstance_check(x, other):
    if isinstance(other, torch.Tensor):
        return x * other
    return x * float(other)


def test_isinstance_branch():
    check(isinstance_check, lambda: (torch.randn(4, 8), torch.randn(8)))
    check(isinstance_check, lambda: (torch.randn(4, 8), 3))


def scaled(x, scale=2.0, *, shift=0.0):
    return x * scale + shift


def test_root_defaults_and_keyword_arguments():
    compiled = check(scaled, x48)
    (x,) = x48()
    torch.testing.assert_close(compiled(x, shift=1.0), scaled(x, shift=1.0))
    torch.testing.assert_close(compiled(x, scale=-1.0), scaled(x, scale=-1.0))
    torch.testing.assert_close(compiled(x, 3.0, shift=2.0), scaled(x, 3.0, shift=2.0))
    assert kiln.stats()["eager_fallbacks"] == 0


def two_returns(x, flag):
    if flag:
        return x + 1
    else:
        return torch.exp(x)


def test_early_return_on_flag():
    check(two_returns, lambda: (torch.randn(4, 8), True))
    check(two_returns, lambda: (torch.randn(4, 8), False))


def validates_input(x):
    assert x.dim() == 2, "expected a matrix"
    if x.shape[-1] % 2:
        raise ValueError(f"odd feature size {x.shape[-1]}")
    return x * 2


def test_assert_and_raise_on_shapes_not_taken():
    check(validates_input, x48)


def test_validation_that_raises_raises_like_eager():
    compiled = kiln.compile(validates_input)
    with pytest.raises(ValueError, match="odd feature size 5"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled(torch.randn(3, 5))


# --------------------------------------------------------------------------------------------
# loops
# --------------------------------------------------------------------------------------------

def repeat_n(x, n):
    for i in range(n):
        x = torch.sin(x) + i * 0.1
    return x


def test_range_loop_count_from_argument_recompiles_on_change():
    compiled = check(repeat_n, lambda: (torch.randn(4, 8), 3))
    n = recompiles()
    (x,) = x48()
    torch.testing.assert_close(compiled(x, 5), repeat_n(x, 5))
    torch.testing.assert_close(compiled(x, 0), repeat_n(x, 0))
    assert recompiles() == n + 2


def weighted_sum(tensors, weights=(0.5, 0.3, 0.2)):
    out = tensors[0] * 0
    for t in tensors:
        out = out + t * t
    for w in weights:
        out = out * w
    return out


def test_loop_over_tuple_of_tensors():
    check(weighted_sum, lambda: (tuple(torch.randn(3, 4) for _ in range(3)),))


def test_loop_over_list_of_tensors():
    check(weighted_sum, lambda: ([torch.randn(3, 4) for _ in range(4)],))


def loop_with_break_and_continue(x, limit):
    for i in range(10):
        if i % 2 == 1:
            continue
        if i >= limit:
            break
        x = x * 1.1 + i
    return x


def test_loop_with_break_and_continue():
    check(loop_with_break_and_continue, lambda: (torch.randn(4, 8), 5))


def while_counter(x, steps):
    i = 0
    while i < steps:
        x = x * 0.5 + torch.cos(x)
        i += 1
    return x


def test_while_loop_with_python_counter():
    check(while_counter, lambda: (torch.randn(4, 8), 3))


def nested_ranges(x):
    for i in range(2):
        for j in range(1, 8, 3):
            x = x + i * j
    return x


def test_nested_range_loops():
    check(nested_ranges, x48)


def zip_pairs(a, b):
    out = a * 0
    for p, q in zip((a, b), (b, a)):
        out = out + p * q
    return out


def test_zip_unrolls():
    check(zip_pairs, lambda: (torch.randn(3, 3), torch.randn(3, 3)))


def zip_strict_pairs(a, b):
    out = a * 0
    for p, q in zip((a, b), (b, a), strict=True):  # torch's RNN modules zip this way
        out = out + p * q
    return out


def test_zip_strict_unrolls_and_raises_on_unequal_lengths():
    check(zip_strict_pairs, lambda: (torch.randn(3, 3), torch.randn(3, 3)))

    def unequal(xs, ys):
        return [x * y for x, y in zip(xs, ys, strict=True)]

    for run in (unequal, kiln.compile(unequal)):
        with pytest.raises(ValueError, match="zip"):
            run([torch.ones(2)] * 2, [torch.ones(2)] * 3)


def overlapping_chunks(x):
    # Longformer's _chunk: the stride list, edited, for an overlapping as_strided view
    x = x.view(x.size(0), x.size(1) // 4, 4, x.size(2))
    size, stride = list(x.size()), list(x.stride())
    size[1], stride[1] = size[1] * 2 - 1, stride[1] // 2
    return x.as_strided(size=size, stride=stride) * 1, x.stride(-1), x.transpose(0, 1).stride()


def test_tensor_stride_is_captured():
    check(overlapping_chunks, lambda: (torch.randn(3, 16, 2),))


class ChannelsFirstLayerNorm(torch.nn.LayerNorm):
    # SqueezeBERT's layer norm: the base class's forward called explicitly with self
    def forward(self, x):
        x = x.permute(0, 2, 1)
        x = torch.nn.LayerNorm.forward(self, x)
        return x.permute(0, 2, 1)


def test_a_base_module_class_forward_called_with_self_is_inlined():
    norm = ChannelsFirstLayerNorm(6)
    with torch.no_grad():
        norm.weight.uniform_()
    check(lambda x: norm(x) * 2, lambda: (torch.randn(2, 6, 5),))


class SavingGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # BLOOM's GeLUFunction: saves its input for a backward of its own
        ctx.save_for_backward(x)
        return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.sigmoid(1.702 * x)


class ScaledBy(torch.autograd.Function):
    @staticmethod
    def forward(x, k):  # the newer form: no ctx in forward, a setup_context
        return x * k

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.k = inputs[1]

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k, None


def custom_functions(x):
    return SavingGelu.apply(x) + ScaledBy.apply(x, 3.0)


def test_autograd_function_apply_without_gradients_is_its_forward():
    with torch.no_grad():
        check(custom_functions, lambda: (torch.randn(4, 5),))
    check(custom_functions, lambda: (torch.randn(4, 5),))  # grad mode, nothing tracked


def test_autograd_function_apply_with_a_tracked_input_keeps_its_backward():
    x = torch.randn(4, 5, requires_grad=True)
    kiln.compile(custom_functions)(x).sum().backward()
    ours = x.grad
    x.grad = None
    custom_functions(x).sum().backward()
    torch.testing.assert_close(ours, x.grad)


def contiguity_answers(x):
    # torch's rule: one-element dims index nothing, an empty tensor is contiguous
    flags = []
    for t in (x, x[:, None], x.t(), x[:1].t(), x.new_zeros(0, 3).t(), x.view(2, 3, 1, 2).permute(0, 2, 3, 1)):
        flags.append(t.is_contiguous())
        if t.dim() == 4:
            flags.append(t.is_contiguous(memory_format=torch.channels_last))
    return x * (1 + sum(f << i for i, f in enumerate(flags)))


def test_is_contiguous_answers_as_torch_does():
    check(contiguity_answers, lambda: (torch.randn(4, 3),))


def enumerate_scales(a, b):
    out = a * 0
    for i, t in enumerate((a, b)):
        out = out + t * (i + 1)
    return out


def test_enumerate_unrolls():
    check(enumerate_scales, lambda: (torch.randn(3, 3), torch.randn(3, 3)))


def reversed_enumerate_zip(xs, ws):
    acc = xs[0] * 0
    for i, (x, w) in enumerate(zip(reversed(xs), ws), 1):
        acc = acc + x * w * i
    return acc


def test_reversed_enumerate_zip_nested():
    check(reversed_enumerate_zip, lambda: ((torch.randn(4), torch.randn(4), torch.randn(4)), (torch.randn(4), torch.randn(4))))


class NamedSequential(nn.Module):
    def __init__(self):
        super().__init__()
        from collections import OrderedDict
        self.body = nn.Sequential(OrderedDict(proj=nn.Linear(8, 8), act=nn.GELU(), out=nn.Linear(8, 8)))

    def forward(self, x):
        return self.body[-1](self.body[0](x)) + self.body(x)


def test_named_sequential_iteration_and_indexing(no_grad):
    check(NamedSequential(), x48)


# --------------------------------------------------------------------------------------------
# shape arithmetic
# --------------------------------------------------------------------------------------------

def shape_math(x):
    half = x.shape[0] // 2
    scale = x.size(-1) ** 0.5
    return x.reshape(half, 2, x.shape[-1]).sum(dim=1) / scale


def test_shape_floor_division_and_size_power():
    check(shape_math, lambda: (torch.randn(6, 9),))


def test_new_input_shape_or_dtype_recompiles():
    compiled = check(shape_math, lambda: (torch.randn(6, 9),))
    n = recompiles()
    for x in (torch.randn(4, 16), torch.randn(6, 9, dtype=torch.float64), torch.randn(9, 6).t()):
        torch.testing.assert_close(compiled(x), shape_math(x))
    assert recompiles() == n + 3
    assert kiln.stats()["eager_fallbacks"] == 0


def shape_unpack(x):
    b, n = x.shape
    return x.view(b, n // 2, 2).transpose(1, 2).reshape(b * 2, n // 2)


def test_tuple_unpacking_of_shape():
    check(shape_unpack, x48)


def dims_and_len(x):
    y = x * x.dim() + len(x)
    return y.flatten() * x.ndim / x.numel()


def test_dim_len_ndim_numel():
    check(dims_and_len, lambda: (torch.randn(3, 4, 5),))


def shape_with_math_module(x):
    d = x.shape[-1]
    return x * (1.0 / math.sqrt(d)) + min(d, 3) - max(1, x.dim())


def test_shape_with_math_module_and_min_max():
    check(shape_with_math_module, x48)


def star_unpack_shape(x):
    *batch, d = x.shape  # break: unpack-ex
    return x * d


def test_star_unpacking_of_shape():
    matches_eager_or_falls_back(star_unpack_shape, x48, "UNPACK_EX", "unpack-ex")


# --------------------------------------------------------------------------------------------
# returned structures
# --------------------------------------------------------------------------------------------

def returns_tuple(x):
    return torch.relu(x), torch.sigmoid(x)


def returns_list(x):
    return [x + 1, x * 2, x.sum(dim=0)]


def returns_nested(x):
    y = x * 2
    return y, [x - 1, (y.mean(dim=-1), y)]


def returns_tensor_and_shape(x):
    return x.transpose(0, 1) * 2, x.shape[0]


@pytest.mark.parametrize("fn", [returns_tuple, returns_list, returns_nested, returns_tensor_and_shape],
                         ids=lambda f: f.__name__)
def test_returned_structures(fn):
    compiled = check(fn, x48)
    out = compiled(*x48())
    assert type(out) is type(fn(*x48()))


def returns_input_and_result(x):
    return x, x * 2


def test_returned_input_is_the_input_object():
    (x,) = x48()
    compiled = check(returns_input_and_result, x48)
    assert compiled(x)[0] is x


def returns_dict(x):
    return {"logits": x * 2, "probs": x.softmax(dim=-1)}


def test_returned_dict():
    compiled = check(returns_dict, x48)
    assert list(compiled(*x48()).keys()) == ["logits", "probs"]


# --------------------------------------------------------------------------------------------
# in-place ops on fresh intermediates
# --------------------------------------------------------------------------------------------

def inplace_chain(x):
    y = x * 2
    y += 1
    y *= x
    y /= 3
    y -= x
    return y


def test_inplace_ops_on_fresh_intermediate():
    check(inplace_chain, x48)


def _accumulate(t, other):
    t += other
    t *= 0.5
    return t


def inplace_in_helper(x, y):
    acc = x + y
    acc = _accumulate(acc, y)
    return acc


def test_inplace_ops_inside_a_helper_on_an_intermediate():
    check(inplace_in_helper, lambda: (torch.randn(4, 8), torch.randn(4, 8)))


def inplace_through_alias(x):
    y = x * 2
    z = y
    y += 1
    return z


def test_inplace_on_intermediate_seen_through_an_alias():
    check(inplace_through_alias, x48)


def inplace_through_view(x):
    y = x * 2
    flat = y.view(-1)
    y += 1  # flat, a live view of y, is taken again from the updated y
    return flat


def test_inplace_on_intermediate_with_a_live_view_is_seen_through_the_view():
    (x,) = x48()
    torch.testing.assert_close(kiln.compile(inplace_through_view)(x), inplace_through_view(x))
    e = kiln.explain(inplace_through_view)(x)
    assert e.graph_count == 1 and not e.break_reasons, e.break_reasons


# Ops whose eager result shares memory with their operand (a view, or the operand itself).
_ALIASING = {
    "view": lambda y: y.view(-1),
    "reshape": lambda y: y.reshape(2, 16),
    "torch.reshape": lambda y: torch.reshape(y, (-1,)),
    "transpose": lambda y: y.transpose(0, 1),
    "permute": lambda y: y.permute(1, 0),
    "unsqueeze": lambda y: y.unsqueeze(0),
    "squeeze": lambda y: y.squeeze(),
    "T": lambda y: y.T,
    "mT": lambda y: y.mT,
    "swapaxes": lambda y: y.swapaxes(0, 1),
    "flatten": lambda y: y.flatten(),
    "torch.flatten": lambda y: torch.flatten(y),
    "t": lambda y: y.t(),
    "torch.t": lambda y: torch.t(y),
    "float (same dtype)": lambda y: y.float(),
    "to (same dtype)": lambda y: y.to(torch.float32),
    "type (same dtype)": lambda y: y.type(torch.float32),
    "contiguous": lambda y: y.contiguous(),
}
@pytest.mark.parametrize("alias", list(_ALIASING.values()), ids=list(_ALIASING))
def test_inplace_update_seen_through_an_aliasing_op(alias):
    def update_base(x):
        y = x * 2
        a = alias(y)
        y += 1
        return a * 1

    def update_alias(x):
        y = x * 2
        a = alias(y)
        a *= 3
        return y - 1

    matches_eager_or_falls_back(update_base, x48, "view")
    matches_eager_or_falls_back(update_alias, x48, "view")


def inplace_through_list(x):
    y = x * 2
    kept = [y, x]
    y += 1
    return kept[0] + kept[1]


def _add_one_in_place(t):
    t += 1


def inplace_in_callee_seen_by_caller(x):
    y = x * 2
    _add_one_in_place(y)
    return y


class DropoutAlias(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.2)
        self.skip = nn.Identity()

    def forward(self, x):
        a = x * 2
        h = self.drop(a)  # eval: h is a
        h += 1
        s = self.skip(h)  # s is h
        s *= 2
        return a


@pytest.mark.parametrize("fn", [inplace_through_list, inplace_in_callee_seen_by_caller],
                         ids=lambda f: f.__name__)
def test_inplace_update_seen_by_every_name(fn):
    check(fn, x48)


def test_inplace_update_through_identity_and_eval_dropout(no_grad):
    check(DropoutAlias().eval(), x48)


def inplace_after_clone(x):
    y = x.clone()
    y += 1
    z = x.t().contiguous()
    z *= 2
    return y, z


def test_inplace_after_clone_and_contiguous_copy():
    check(inplace_after_clone, x48)


def inplace_after_float(x):
    y = x.float()
    y += 1
    return y * 2


def test_inplace_after_float_on_float_input_matches_eager():
    # eager: x.float() of a float32 x is x itself, so `y += 1` updates the caller's tensor.
    matches_eager_or_falls_back(inplace_after_float, x48, "in-place")


# --------------------------------------------------------------------------------------------
# unsupported constructs: run eagerly with a reason and a location
# --------------------------------------------------------------------------------------------

def uses_item(x):
    s = x.abs().sum().item()  # break: item
    return x / s


def test_item_falls_back():
    assert_falls_back(uses_item, x48, "item", "item")


def uses_print(x):
    y = x * 2
    print("shape", y.shape)  # break: print
    return y


def test_print_falls_back(capsys):
    assert_falls_back(uses_print, x48, "print", "print")
    assert "shape" in capsys.readouterr().out


def data_dependent_if(x):
    if x.sum() > 0:  # break: data-if
        return x * 2
    return x - 1


def test_data_dependent_branch_falls_back():
    assert_falls_back(data_dependent_if, x48, "data-dependent", "data-if")


def list_comprehension(a, b):
    scaled = [t * 2 for t in (a, b)]
    return scaled[0] + scaled[1]


def test_list_comprehension():
    # 3.12 inlines comprehensions into the frame (PEP 709); 3.11 makes a function of them.
    check(list_comprehension, lambda: (torch.randn(3, 3), torch.randn(3, 3)))


def generator_expression(a, b):
    return sum(t * 2 for t in (a, b))


def test_generator_expression():
    check(generator_expression, lambda: (torch.randn(3, 3), torch.randn(3, 3)))


def _doubled(tensors):
    for t in tensors:
        yield t * 2


def uses_generator(a, b):
    out = a
    for t in _doubled((a, b)):
        out = out + t
    return out


def test_generator_function_is_inlined():
    check(uses_generator, lambda: (torch.randn(3, 3), torch.randn(3, 3)))


def test_compiled_generator_function_runs_eagerly():
    gen = kiln.compile(_doubled)
    a, b = torch.randn(3), torch.randn(3)
    for got, want in zip(gen((a, b)), _doubled((a, b))):
        torch.testing.assert_close(got, want)


def inplace_on_input(x):
    x += 1  # the caller's tensor changes, as in eager: written back after the graph
    return x * 2


def test_inplace_on_input_is_written_back():
    check(inplace_on_input, x48)


def inplace_method_with_other_input(x, y):
    x.mul_(y)
    return x + y


def test_inplace_method_with_another_input_is_written_back():
    check(inplace_method_with_other_input, lambda: (torch.randn(3, 3), torch.randn(3, 3)))


def tensor_indexing(x):
    return x[0] * 2


def test_tensor_indexing():
    check(tensor_indexing, x48)


def tensor_slicing(x):
    return x[:, :2] + 1


def test_tensor_slicing():
    check(tensor_slicing, x48)


@pytest.mark.parametrize("index", [
    (0,), (-1,), (slice(1, 3),), (slice(None, None, 2),), (Ellipsis, 1), (None, 0), (slice(None), None, slice(-3, None)),
    (1, slice(2, -1)), (Ellipsis, slice(None, 100)), (slice(5, 2),),
], ids=str)
def test_basic_indexing_forms(index):
    def f(x):
        return x[index] * 3 + 1
    check(f, lambda: (torch.randn(4, 8),))


def returns_a_slice_of_the_input(x):
    return x[1:, 2:]


def test_returned_slice_is_a_view_of_the_input():
    (x,) = x48()
    out = kiln.compile(returns_a_slice_of_the_input)(x)
    torch.testing.assert_close(out, x[1:, 2:])
    assert out.data_ptr() == x[1:, 2:].data_ptr() and out.stride() == x[1:, 2:].stride()


def index_out_of_range(x):
    return x[9] + 1


def test_index_out_of_range_raises_eagers_index_error():
    (x,) = x48()
    with pytest.raises(IndexError) as eager:
        index_out_of_range(x)
    with pytest.raises(IndexError) as compiled:
        kiln.compile(index_out_of_range)(x)
    assert str(compiled.value) == str(eager.value)


def advanced_indexing(x, idx):
    return x[idx] * 2 + x[:, idx].sum()


def test_advanced_indexing_is_an_extern_call():
    check(advanced_indexing, lambda: (torch.randn(4, 8), torch.tensor([0, 2])))


def boolean_mask_indexing(x, mask):
    return x[:, mask].sum() * 2  # break: mask-index


def test_boolean_mask_indexing_breaks():
    # the result's shape depends on the mask's values: no layout to plan, so Python runs it
    assert_falls_back(boolean_mask_indexing, lambda: (torch.randn(4, 8), torch.rand(8) > 0.5), "no layout",
                      "mask-index")


def _helper_with_item(x):
    return x * x.abs().sum().item()  # break: helper-item


def calls_helper_with_item(x):
    return _helper_with_item(x + 1) - 1


def test_fallback_inside_a_helper_reports_the_helpers_line():
    assert_falls_back(calls_helper_with_item, x48, "item", "helper-item")


class ModuleWithPrint(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        print(y.shape)  # break: module-print
        return y


def test_fallback_inside_a_module_forward(no_grad, capsys):
    assert_falls_back(ModuleWithPrint(), x48, "print", "module-print")


def default_with_or(x, eps=None):
    eps = eps or 1e-5  # break: or-default
    return x / (x.abs() + eps)


def test_or_default_idiom():
    matches_eager_or_falls_back(default_with_or, x48, "JUMP_IF_TRUE_OR_POP", "or-default")


def _clamp_pair(a, b):
    return torch.max(a, b) - torch.max(a)


def uses_torch_max(a, b):
    return _clamp_pair(a, b) * 2


def torch_max_with_dim(x):
    values, indices = torch.max(x, dim=-1)  # break: max-dim
    return values * 2, indices


def test_torch_max_of_two_tensors_and_of_one():
    check(uses_torch_max, lambda: (torch.randn(4, 8), torch.randn(4, 8)))


def test_torch_max_with_dim():
    matches_eager_or_falls_back(torch_max_with_dim, x48, "max", "max-dim")


def defines_inner_function(x):
    def inner(t):
        return t * 2
    return inner(x) + 1


def test_nested_function_definition():
    check(defines_inner_function, x48)


def grad_mode_block(x):
    with torch.no_grad():  # break: with-no-grad
        y = x * 2
    return y + 1


def test_with_no_grad_block():
    matches_eager_or_falls_back(grad_mode_block, x48, "", "with-no-grad")


# --------------------------------------------------------------------------------------------
# in-place Tensor methods on intermediates
# --------------------------------------------------------------------------------------------

def inplace_methods(x, y):
    h = x * 2
    alias = h
    h.add_(y)
    h.mul_(0.5).relu_()
    return alias, h.sigmoid_()


def test_inplace_methods_on_intermediates_update_every_alias():
    check(inplace_methods, lambda: (torch.randn(4, 8), torch.randn(8)))


def inplace_method_on_input(x):
    x.mul_(2)
    return x + 1


def test_inplace_method_on_input_is_written_back():
    check(inplace_method_on_input, lambda: (torch.randn(4, 8),))


def inplace_method_casting_back(x, y64):
    h = x * 2
    h.add_(y64)
    return h


def test_inplace_method_that_casts_its_result_back():
    # float32 += float64 computes in float64 and casts back into the float32 tensor, as eager
    check(inplace_method_casting_back, lambda: (torch.randn(4, 8), torch.randn(8, dtype=torch.float64)))


class _Finder:
    """setuptools' _distutils_hack.DistutilsMetaFinder.find_spec: str.format(**locals())."""

    def find_spec(self, fullname, path, target=None):
        if path is not None and not fullname.startswith("test."):
            return None
        return "spec_for_{fullname}".format(**locals())


_FINDER = _Finder()


def test_locals_in_an_inlined_function_are_its_own():
    """locals() (and vars()) is the frame's own dict of its bound variables, in CPython's order:
    as a break, it ran in the frame that runs the break and missed the function's arguments
    (a KeyError where eager has none)."""
    def fn(x, y):
        scale = 2.0
        names = list(locals())
        spec = _FINDER.find_spec("abc", None)
        return x * scale + y, (names, spec, sorted(vars()))

    check(lambda x, y: fn(x, y)[0], lambda: (torch.randn(3), torch.randn(3)))
    x, y = torch.randn(3), torch.randn(3)
    assert kiln.compile(fn)(x, y)[1] == fn(x, y)[1] == (["x", "y", "scale"], "spec_for_abc", ["names", "scale", "spec", "x", "y"])


def test_locals_sees_closure_variables_and_skips_unbound_ones():
    offset = 1.5

    def fn(x):
        if x.shape[0] > 100:
            unused = 1  # noqa: F841 - unbound at the locals() call
        d = locals()
        return x + offset * d["offset"], sorted(d)

    check(lambda x: fn(x)[0], lambda: (torch.randn(3),))
    x = torch.randn(3)
    assert kiln.compile(fn)(x)[1] == fn(x)[1] == ["offset", "x"]


def test_in_place_update_of_a_result_viewing_memory_the_torch_call_made():
    """einsum's result is a permuted view of the product it made (its `_base` is none of its
    inputs): an update in place is an update of a fresh tensor (Funnel's `positional_attn *=
    cls_mask`, LongT5's `scores += position_bias`), not a break."""
    def funnel(q, r, mask):
        b, i, n, h = q.shape
        pa = torch.einsum("binh,tnh->bnit", q, r)
        pa = torch.reshape(pa, [b, n, pa.shape[-1], i])[:, :, 1:, :]
        pa = torch.reshape(pa, [b, n, i, -1])[..., :i]
        pa *= mask
        return pa

    def longt5(q, k, bias):
        scores = torch.einsum("bnqd,bnkd->bnqk", q, k)
        scores += bias
        return scores.softmax(-1)

    check(funnel, lambda: (torch.randn(2, 8, 4, 8), torch.randn(17, 4, 8), torch.randn(8, 8)))
    check(longt5, lambda: (torch.randn(2, 4, 8, 16), torch.randn(2, 4, 8, 16), torch.randn(1, 4, 8, 8)))


def test_in_place_update_through_a_torch_call_that_views_its_input_reaches_the_input():
    """movedim's result views its input (`_base` is the input): the update reaches it, as in eager."""
    def fn(a):
        x = a * 2
        y = torch.movedim(x, 0, 1)
        y += 1
        return x, y

    check(fn, lambda: (torch.randn(3, 4),))


def test_numpy_names_of_arguments_are_taken_as_torch_takes_them():
    """axis= for dim=, keepdims= for keepdim=, x= for the input (I-BERT's x.mean(axis=2),
    Funnel's torch.cat(..., axis=1))."""
    def fn(x, y):
        m = x.mean(axis=2, keepdim=True)
        v = torch.mean((x - m) ** 2, axis=2, keepdims=True)
        s = torch.sum(x, axis=2, keepdim=True)
        c = torch.cat([y[:, :1], y], axis=1)
        return (x - m) / torch.sqrt(1e-5 + v) + s, c, torch.sin(input=y)

    check(fn, lambda: (torch.randn(2, 8, 32), torch.randn(2, 8, 32)))


class _WithDevice(torch.nn.Module):
    """Hugging Face's PreTrainedModel.device: a property that builds a new torch.device."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))

    @property
    def device(self):
        return next(p.device for p in self.parameters())

    def forward(self, x):
        return torch.ones(4, device=self.device) + x * self.w


def test_a_device_read_afresh_at_every_call_is_guarded_by_value():
    """`self.device` is a new torch.device object per read: guarded by identity, every call
    recompiled (XLNet) until the cache limit sent the module to eager."""
    m = _WithDevice()
    compiled = kiln.compile(m)
    before = kiln.stats()
    with torch.no_grad():
        for _ in range(10):
            x = torch.randn(4)
            torch.testing.assert_close(compiled(x), m(x))
    after = kiln.stats()
    assert after["recompiles"] == before["recompiles"] and after["eager_fallbacks"] == before["eager_fallbacks"]


_PROBES = []


@torch._dynamo.assume_constant_result
def _probe_installed():
    """A package probe as Hugging Face writes them: what it walks (importlib's machinery) is not
    traceable, and the marker says its answer does not change."""
    import importlib.util
    _PROBES.append(1)
    return importlib.util.find_spec("a_package_that_is_not_installed") is not None


def _lru_probe_body():
    import importlib.util
    return importlib.util.find_spec("another_package_not_installed") is not None


_lru_probe_body._dynamo_marked_constant = True  # what transformers' _make_compile_constant sets
_lru_probe = functools.lru_cache(_lru_probe_body)


def test_functions_marked_constant_are_called_once_at_capture():
    def fn(x):
        if _probe_installed() or _lru_probe():
            return x + 1
        return x * 2

    compiled = check(fn, lambda: (torch.randn(3),))
    calls = len(_PROBES)
    compiled(torch.randn(3))
    compiled(torch.randn(3))
    assert len(_PROBES) == calls, "a marked function runs at capture only, as TorchDynamo runs it"


def test_calls_that_read_their_frame_are_not_run_at_a_break():
    """globals() (and dir(), sys._getframe()) in a helper of another module: run at a graph
    break they read the frame that runs the break (a KeyError where eager has none); the call
    runs eagerly instead."""
    namespace = {"MARK": "helper's module", "sys": sys}
    exec("def helper(x):\n"
         "    g = globals()\n"
         "    return x + 1, g['MARK'], sorted(dir()), sys._getframe().f_code.co_name\n", namespace)
    helper = namespace["helper"]

    def fn(x):
        return helper(x * 2)

    x = torch.randn(3)
    want, got = fn(x), kiln.compile(fn)(x)
    torch.testing.assert_close(got[0], want[0])
    assert got[1:] == want[1:] == ("helper's module", ["g", "x"], "helper")


@pytest.mark.parametrize("method", ["view_as", "reshape_as", "expand_as"])
def test_shape_of_another_tensor_methods_are_registry_views(method):
    # x.view_as(y) is x.view(y.shape): a registry op, so autocast capture knows it too
    def fn(x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return getattr(x[:1] if method == "expand_as" else x, method)(y) * y

    check(fn, lambda: (torch.randn(4, 6) if method == "expand_as" else torch.randn(6, 4).t().contiguous(), torch.randn(4, 6)))
