"""Coverage of the Python and bytecode features a TorchDynamo-like capture must handle.

Each test is written the way model code is written and compares kiln with eager PyTorch on
fresh random inputs. Code that kiln must capture whole goes through ``check`` from _helpers.py:
one graph, no break reason, no eager fallback, two calls (the second on new values of the same
layout, without recompiling) equal to eager, inputs left as eager leaves them.

Graph-break cases (a ``print``, a branch on a tensor's value, ``.item()`` in the middle of the
code) go through ``check_break``: ``kiln.explain`` must report at least one graph break (so the
code around the break is captured, not the whole call run eagerly) at the line marked
``# break: <tag>`` and the compiled function must match eager on fresh inputs.

Module tests run in eval mode under ``torch.no_grad()`` (training is tests/python/test_training.py).

Constructs kiln does not capture yet (these run in Python, tested for eager's results and a
reason): match statements, functools.partial over tensors, instantiating user classes /
dataclasses / SimpleNamespace and setattr on them, type(tensor_input), unpacking a tensor,
torch.set_grad_enabled, @torch.no_grad() decorated helpers, indexed assignment into tensors,
zero_/fill_, forward hooks with kwargs, BatchNorm in training mode, in-place updates of module
buffers, next(self.parameters()), and graph breaks inside loops / with blocks / comprehensions /
with nonlocal state / with a live iterator (these run the whole call eagerly, like
torch._dynamo's skip-frame). Their tests are named ``*_runs_in_python`` and go through
``runs_in_python``: kiln.compile(fn) must give eager's outputs (and leave inputs and module
state as eager does) on fresh inputs, and ``kiln.explain`` must report a break reason naming
the construct. When kiln captures one of them, its test should go back to ``check`` /
``check_break``.
"""
from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import math
import os
import re
import types
import typing
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kiln
from _helpers import _copy_args, assert_same, check as _check

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
    if isinstance(a, dict):
        return {k: _clone(v) for k, v in a.items()}
    return a


def _tensors(a):
    if isinstance(a, torch.Tensor):
        return [a]
    if isinstance(a, (tuple, list)):
        return [t for v in a for t in _tensors(v)]
    if isinstance(a, dict):
        return [t for v in a.values() for t in _tensors(v)]
    return []


def _why(e) -> str:
    return "; ".join(f"{r['reason']} (at {r['location']})" for r in e.break_reasons) or "no reason given"


_MARKERS: dict[str, int] = {}


def line_of(tag: str) -> int:
    """The line of this file that ends in a `# break: <tag>` comment."""
    if not _MARKERS:
        with open(__file__) as f:
            for no, text in enumerate(f, 1):
                m = re.search(r"# break: (\S+)\s*$", text)
                if m:
                    assert m.group(1) not in _MARKERS, f"marker {m.group(1)} used twice"
                    _MARKERS[m.group(1)] = no
    return _MARKERS[tag]


def check(fn, *args, **kwargs):
    """_helpers.check (one graph, no break, no fallback, two calls equal to eager), preceded by
    a plain comparison of kiln.compile(fn) with eager on the same and on fresh values, so that
    a wrong result is reported as one even where kiln also fails to capture the code."""
    compiled = kiln.compile(fn)
    for fresh in (False, True):
        a = _copy_args(args, fresh=fresh)
        eager_args, kiln_args = _copy_args(a), _copy_args(a)
        expected = fn(*eager_args)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            actual = compiled(*kiln_args)
        assert_same(actual, expected, path="wrong result: out")
        assert_same(kiln_args, eager_args, path="wrong result: inputs after the call")
    kiln.reset()
    return _check(fn, *args, **kwargs)


def same_as_eager(compiled, fn, *args):
    """One call of compiled against eager fn on copies of args: outputs and inputs after."""
    eager_args, kiln_args = _clone(args), _clone(args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        actual = compiled(*kiln_args)
    expected = fn(*eager_args)
    torch.testing.assert_close(actual, expected, msg=lambda m: f"wrong result: {m}")
    torch.testing.assert_close(_tensors(kiln_args), _tensors(eager_args),
                               msg=lambda m: f"wrong result: inputs after the call differ: {m}")
    return actual


def check_break(fn, make, tag=None, *, calls=2):
    """fn has a graph break kiln must split at: kiln.compile(fn) matches eager on `calls` fresh
    inputs, and explain reports at least one graph break and at least one graph (the code
    around the break is captured, not the whole call run eagerly) and, with tag, a break reason
    at the line whose break-marker comment names tag."""
    compiled = kiln.compile(fn)
    for _ in range(calls):
        same_as_eager(compiled, fn, *make())
    e = kiln.explain(fn)(*_clone(make()))
    assert e.graph_break_count >= 1 and e.graph_count >= 1, (
        f"expected the code around the break to be captured; got {e.graph_count} graph(s), "
        f"{e.graph_break_count} break(s): {_why(e)}")
    if tag is not None:
        where = f"{THIS_FILE}:{line_of(tag)}"
        assert any(r["location"].endswith(where) for r in e.break_reasons), (
            f"no break reported at {where} ({tag}): {_why(e)}")
    return compiled


def runs_in_python(fn, make_args, reason_substring, *, calls=2, capsys=None):
    """fn uses a construct kiln does not capture yet, so kiln runs it in Python (the whole call,
    or the one instruction between two graphs). kiln.compile(fn) must match eager on `calls`
    fresh inputs from make_args(): outputs, inputs after the call and, for a module, its
    parameters and buffers after the call (eager runs on a deep copy). With capsys, the compiled
    call must print what eager prints. kiln.explain must report at least one break reason, one
    of which contains reason_substring (a string, or a tuple of strings any of which will do)."""
    subs = (reason_substring,) if isinstance(reason_substring, str) else tuple(reason_substring)
    is_module = isinstance(fn, nn.Module)
    eager_fn = copy.deepcopy(fn) if is_module else fn
    compiled = kiln.compile(fn)
    for call in range(calls):
        args = make_args()
        eager_args, kiln_args = _clone(args), _clone(args)
        if capsys is not None:
            capsys.readouterr()
        expected = eager_fn(*eager_args)
        eager_printed = capsys.readouterr().out if capsys is not None else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            actual = compiled(*kiln_args)
        if capsys is not None:
            printed = capsys.readouterr().out
            assert printed == eager_printed, f"call {call}: printed {printed!r} != eager {eager_printed!r}"
        assert_same(actual, expected, path=f"wrong result (call {call}): out")
        assert_same(list(kiln_args), list(eager_args), path=f"wrong result (call {call}): inputs after the call")
        if is_module:
            state, eager_state = fn.state_dict(), eager_fn.state_dict()
            assert list(state) == list(eager_state)
            assert_same(list(state.values()), list(eager_state.values()),
                        path=f"wrong result (call {call}): module state {list(state)}")
    e = kiln.explain(copy.deepcopy(fn) if is_module else fn)(*_clone(make_args()))
    if capsys is not None:
        capsys.readouterr()
    assert e.break_reasons, "expected kiln to report why it does not capture this code"
    assert any(sub in r["reason"] for r in e.break_reasons for sub in subs), (
        f"no break reason containing {' or '.join(map(repr, subs))}: {_why(e)}")
    return compiled


def recompiles() -> int:
    return kiln.stats()["recompiles"]


def fallbacks() -> int:
    return kiln.stats()["eager_fallbacks"]


def check_after_change(model, x, change):
    """model is captured whole; a compiled call, then change(model), then the compiled call
    must match eager again, through a recompile and without an eager fallback."""
    check(model, x)
    compiled = kiln.compile(model)
    same_as_eager(compiled, model, x)
    change(model)
    n, fb = recompiles(), fallbacks()
    for _ in range(2):
        same_as_eager(compiled, model, torch.randn_like(x))
    assert fallbacks() == fb, kiln.stats()["fallback_reasons"]
    assert recompiles() > n, "the change did not recompile"


def x48():
    return torch.randn(4, 8)


def mk(*shape):
    return lambda: (torch.randn(*shape),)


def tensors(n, *shape):
    return [torch.randn(*shape) for _ in range(n)]


# ============================================================================================
# 1. branches on values known at capture time
# ============================================================================================

DEBUG = False
USE_GELU = True


def global_flag_branch(x):
    if DEBUG:
        print("debug", x.shape)
    y = F.gelu(x) if USE_GELU else torch.relu(x)
    return y * 2


def test_branch_on_global_flags():
    check(global_flag_branch, x48())


def local_constant_branch(x):
    use_bias = True
    eps = 1e-6
    y = x / (x.abs().sum(dim=-1, keepdim=True) + eps)
    if use_bias:
        y = y + 0.1
    else:
        y = y - 0.1
    return y


def test_branch_on_local_constant():
    check(local_constant_branch, x48())


def batch_branch(x):
    if x.shape[0] > 2:
        return x.mean(dim=0, keepdim=True) + x
    return x * 2


@pytest.mark.parametrize("shape", [(4, 8), (2, 8)], ids=["taken", "not-taken"])
def test_branch_on_batch_size(shape):
    check(batch_branch, torch.randn(*shape))


def flatten_if_3d(x):
    if x.dim() == 3:
        x = x.reshape(-1, x.shape[-1])
    return x.softmax(dim=-1)


@pytest.mark.parametrize("shape", [(2, 3, 8), (6, 8)], ids=["3d", "2d"])
def test_branch_on_dim(shape):
    check(flatten_if_3d, torch.randn(*shape))


def dtype_branch(x):
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    if x.dtype == torch.float64:
        return x * 2
    return torch.tanh(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_branch_on_dtype(dtype):
    check(dtype_branch, torch.randn(4, 8, dtype=dtype))


def float_if_needed(x):
    if not x.is_floating_point():
        x = x.float()
    return x * 0.5 + 1


@pytest.mark.parametrize("make", [lambda: torch.randn(4, 8), lambda: torch.randint(-5, 5, (4, 8))],
                         ids=["float", "int64"])
def test_branch_on_is_floating_point(make):
    check(float_if_needed, make())


class ResidualOption(nn.Module):
    def __init__(self, use_residual):
        super().__init__()
        self.use_residual = use_residual
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = torch.relu(self.fc(x))
        if self.use_residual:
            h = h + x
        return h


@pytest.mark.parametrize("use_residual", [True, False])
def test_branch_on_module_attribute(no_grad, use_residual):
    check(ResidualOption(use_residual).eval(), x48())


class NoisyHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.noise = 0.1

    def forward(self, x):
        h = self.fc(x)
        if self.training and self.noise > 0:
            h = h + torch.randn_like(h) * self.noise
        return h.softmax(dim=-1)


def test_branch_on_training_and_attribute_in_eval(no_grad):
    check(NoisyHead().eval(), x48())


def masked_scores(q, k, mask=None, bias=None):
    s = q @ k.transpose(-2, -1)
    if bias is not None:
        s = s + bias
    if mask is not None:
        s = s.masked_fill(mask, -1e9)
    return s.softmax(dim=-1)


@pytest.mark.parametrize("with_mask", [False, True], ids=["no-mask", "mask"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_optional_arguments_is_none(with_mask, with_bias):
    q, k = torch.randn(4, 8), torch.randn(5, 8)
    mask = torch.rand(4, 5) > 0.7 if with_mask else None
    bias = torch.randn(4, 5) if with_bias else None
    check(masked_scores, q, k, mask, bias)


def scale_by(x, scales):
    if isinstance(scales, (list, tuple)):
        for s in scales:
            x = x * s
        return x
    return x * scales


@pytest.mark.parametrize("scales", [(0.5, 2.0, 3.0), 1.5], ids=["tuple", "float"])
def test_isinstance_of_python_argument(scales):
    check(scale_by, x48(), scales)


class MaybeNorm(nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8) if norm else nn.Identity()

    def forward(self, x):
        h = self.fc(x)
        if isinstance(self.norm, nn.LayerNorm):
            h = h * 0.5
        return self.norm(h)


@pytest.mark.parametrize("norm", [True, False], ids=["layernorm", "identity"])
def test_isinstance_of_submodule(no_grad, norm):
    check(MaybeNorm(norm).eval(), x48())


def device_branch(x):
    if x.device.type == "cpu":
        return x * 2
    return x * 3


def test_branch_on_device_type():
    check(device_branch, x48())


def numel_and_len_branch(x):
    y = x.exp() if x.numel() <= 16 else x.sigmoid()
    if len(x.shape) == 2 and x.size(1) % 2 == 0:
        y = y.reshape(x.shape[0], -1, 2).sum(dim=-1)
    return y


def test_branch_on_numel_and_len_of_shape():
    check(numel_and_len_branch, x48())


def bool_ops_branch(x, force):
    if (x.dim() == 2 and x.shape[1] > 4) or force:
        return torch.relu(x)
    return torch.sigmoid(x)


@pytest.mark.parametrize("force", [False, True])
def test_branch_on_and_or_of_shape_and_flag(force):
    check(bool_ops_branch, torch.randn(4, 3), force)


def shape_equals_tuple(x):
    if x.shape == (4, 8):
        return x.t() * 2
    return x


def test_branch_on_shape_equal_to_tuple():
    check(shape_equals_tuple, x48())


def match_activation(x, act):
    match act:
        case "relu":
            return torch.relu(x)
        case "gelu" | "gelu_tanh":
            return F.gelu(x)
        case _:
            return x


@pytest.mark.parametrize("act", ["relu", "gelu_tanh"])
def test_match_statement_on_string(act):
    check(match_activation, x48(), act)


def match_shape(x):
    match x.shape:
        case (b, d):
            return x.reshape(b, d // 2, 2).sum(dim=-1)
        case _:
            return x


def test_match_statement_on_shape_sequence_runs_in_python():
    runs_in_python(match_shape, lambda: (x48(),), "MATCH_SEQUENCE")


# ============================================================================================
# 2. loops
# ============================================================================================

def loop_over_float_list(x):
    for s in [0.5, 1.0, 2.0]:
        x = torch.tanh(x * s)
    return x


def test_for_over_list_of_floats():
    check(loop_over_float_list, x48())


def loop_over_int_tuple(x):
    acc = x * 0
    for p in (1, 2, 3):
        acc = acc + x ** p / p
    return acc


def test_for_over_tuple_of_ints():
    check(loop_over_int_tuple, x48())


SCALES = {"small": 0.5, "large": 2.0, "neg": -1.0}


def loop_dict_items(x):
    out = x * 0
    for name, s in SCALES.items():
        out = out + torch.sigmoid(x * s) * len(name)
    return out


def test_for_over_dict_items():
    check(loop_dict_items, x48())


def loop_dict_keys(x):
    for k in SCALES.keys():
        x = x + SCALES[k]
    return x


def test_for_over_dict_keys():
    check(loop_dict_keys, x48())


def loop_dict_values(x):
    out = x
    for v in SCALES.values():
        out = out * v + 1
    return out


def test_for_over_dict_values():
    check(loop_dict_values, x48())


def loop_dict_directly(x):
    total = x * 0
    for k in SCALES:
        total = total + x * SCALES[k]
    return total


def test_for_over_dict():
    check(loop_dict_directly, x48())


FEATURE_WEIGHTS = {"rgb": 0.7, "depth": 0.3}


def fuse_features(feats):
    out = None
    for name, t in feats.items():
        w = FEATURE_WEIGHTS[name] * t
        out = w if out is None else out + w
    return out


def test_for_over_dict_of_tensors_argument():
    feats = {"rgb": torch.randn(4, 8), "depth": torch.randn(4, 8)}
    check(fuse_features, feats)
    compiled = kiln.compile(fuse_features)
    for _ in range(2):  # new tensors in a new dict: read at each call
        same_as_eager(compiled, fuse_features, {"rgb": torch.randn(4, 8), "depth": torch.randn(4, 8)})


LAYER_WEIGHTS = [0.1, 0.2, 0.7]


def enumerate_with_start(x):
    for i, w in enumerate(LAYER_WEIGHTS, start=1):
        x = x * w + i
    return x


def test_enumerate_with_start():
    check(enumerate_with_start, x48())


def reversed_range_loop(x):
    for i in reversed(range(4)):
        x = x * 0.5 + i
    return x


def test_for_over_reversed_range():
    check(reversed_range_loop, x48())


def negative_step_range(x):
    for i in range(6, 0, -2):
        x = torch.sin(x) * i
    return x


def test_for_over_range_with_negative_step():
    check(negative_step_range, x48())


class Tower(nn.Module):
    def __init__(self, depth=3):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(depth)])
        self.norms = nn.ModuleList([nn.LayerNorm(8) for _ in range(depth)])
        self.scales = [1.0, 0.5, 0.25][:depth]


class EnumerateModuleList(Tower):
    def forward(self, x):
        for i, layer in enumerate(self.layers):
            h = layer(x)
            x = x + (torch.relu(h) if i % 2 == 0 else torch.tanh(h))
        return x


class ZipModuleLists(Tower):
    def forward(self, x):
        for layer, norm, s in zip(self.layers, self.norms, self.scales):
            x = x + norm(layer(x)) * s
        return x


class ReversedModuleList(Tower):
    def forward(self, x):
        for layer in reversed(self.layers):
            x = torch.relu(layer(x))
        return x


class ModuleListSlice(Tower):
    def forward(self, x):
        for layer in self.layers[1:]:
            x = layer(x)
        return self.layers[0](x)


@pytest.mark.parametrize("cls", [EnumerateModuleList, ZipModuleLists, ReversedModuleList, ModuleListSlice],
                         ids=lambda c: c.__name__)
def test_module_list_iteration(no_grad, cls):
    check(cls().eval(), x48())


class SequentialResidual(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))

    def forward(self, x):
        for m in self.seq:
            x = x + m(x)
        return x


def test_for_over_sequential_in_custom_forward(no_grad):
    check(SequentialResidual().eval(), x48())


class Experts(nn.Module):
    def __init__(self):
        super().__init__()
        self.experts = nn.ModuleDict({"a": nn.Linear(8, 8), "b": nn.Linear(8, 8), "c": nn.Linear(8, 8)})
        self.gates = {"a": 0.5, "b": 0.3, "c": 0.2}


class ModuleDictItems(Experts):
    def forward(self, x):
        out = x * 0
        for name, expert in self.experts.items():
            out = out + expert(x) * self.gates[name]
        return out


class ModuleDictValues(Experts):
    def forward(self, x):
        for expert in self.experts.values():
            x = torch.tanh(expert(x))
        return x


class ModuleDictKeys(Experts):
    def forward(self, x):
        out = x
        for k in self.experts.keys():
            out = self.experts[k](out) * self.gates[k]
        return out


class ModuleDictIn(Experts):
    def forward(self, x):
        if "b" in self.experts:
            x = self.experts["b"](x)
        if "z" in self.experts:
            x = x * 100
        return x


@pytest.mark.parametrize("cls", [ModuleDictItems, ModuleDictValues, ModuleDictKeys, ModuleDictIn],
                         ids=lambda c: c.__name__)
def test_module_dict_iteration(no_grad, cls):
    check(cls().eval(), x48())


class ParamListMix(nn.Module):
    def __init__(self):
        super().__init__()
        self.weights = nn.ParameterList([nn.Parameter(torch.randn(8)) for _ in range(3)])

    def forward(self, x):
        for w in self.weights:
            x = x * torch.sigmoid(w)
        return x


def test_for_over_parameter_list(no_grad):
    check(ParamListMix(), x48())


class ParamDictMix(nn.Module):
    def __init__(self):
        super().__init__()
        self.biases = nn.ParameterDict({"first": nn.Parameter(torch.randn(8)), "second": nn.Parameter(torch.randn(8))})

    def forward(self, x):
        for name, b in self.biases.items():
            x = x + b * len(name)
        return x


def test_for_over_parameter_dict_items(no_grad):
    check(ParamDictMix(), x48())


def while_halving(x):
    while x.shape[-1] > 2:
        x = x.reshape(x.shape[0], -1, 2).mean(dim=-1)
    return x


def test_while_on_shape():
    check(while_halving, torch.randn(3, 16))


def while_true_break(x):
    steps = 0
    while True:
        x = x * 0.9 + 0.1
        steps += 1
        if steps >= 3:
            break
    return x


def test_while_true_with_break_on_counter():
    check(while_true_break, x48())


def while_two_counters(x):
    i, j = 0, 10
    while i < j:
        x = x + (j - i)
        i += 2
        j -= 1
    else:
        x = x * 2
    return x


def test_while_with_two_counters_and_else():
    check(while_two_counters, x48())


def for_else(x, names):
    for n in names:
        if n == "stop":
            x = x * 0
            break
        x = x + len(n)
    else:
        x = torch.relu(x)
    return x


@pytest.mark.parametrize("names", [("ab", "cde"), ("ab", "stop", "x")], ids=["else-runs", "break"])
def test_for_else(names):
    check(for_else, x48(), names)


GRID = [[0.5, 1.0], [2.0], [0.25, 0.75, 1.5]]


def nested_list_loops(x):
    for row in GRID:
        acc = x * 0
        for v in row:
            acc = acc + torch.tanh(x * v)
        x = acc / len(row)
    return x


def test_nested_loops_over_list_of_lists():
    check(nested_list_loops, x48())


def collect_then_reduce(x):
    outs = []
    for k in range(3):
        outs.append(torch.sigmoid(x + k))
    total = outs[0]
    for o in outs[1:]:
        total = total * o
    return total


def test_loop_appending_to_local_list():
    check(collect_then_reduce, x48())


def index_loop(xs):
    out = xs[0]
    for i in range(1, len(xs)):
        out = out + xs[i] * i
    return out


def test_for_over_range_len_indexing_a_list():
    check(index_loop, tensors(4, 3, 5))


def loop_over_shape(x):
    for d in x.shape:
        x = x * (1.0 / d)
    return x


def test_for_over_tensor_shape():
    check(loop_over_shape, torch.randn(2, 3, 4))


def early_return_in_loop(x, limit):
    for i in range(10):
        x = x + i
        if i == limit:
            return x * 2
    return x


def test_return_from_inside_a_loop():
    check(early_return_in_loop, x48(), 3)


# ============================================================================================
# 3. comprehensions and generator expressions
# ============================================================================================

def listcomp_of_floats(x):
    scales = [1.0 / (i + 1) for i in range(4)]
    for s in scales:
        x = x + s
    return x


def test_list_comprehension_over_range():
    check(listcomp_of_floats, x48())


def listcomp_over_tensors(ts):
    acts = [torch.relu(t) * 2 for t in ts]
    out = acts[0]
    for a in acts[1:]:
        out = out + a
    return out


def test_list_comprehension_over_list_of_tensors():
    check(listcomp_over_tensors, tensors(3, 4, 4))


def genexp_sum(ts):
    return sum(t * 2 for t in ts)


def test_sum_of_generator_over_list_of_tensors():
    check(genexp_sum, tensors(3, 4, 4))


MIX = (0.2, 0.3, 0.5)


def genexp_weighted_sum(ts):
    return sum(w * t for w, t in zip(MIX, ts))


def test_sum_of_generator_over_zip():
    check(genexp_weighted_sum, tensors(3, 4, 4))


def dictcomp_of_floats(x):
    doubled = {k: v * 2 for k, v in SCALES.items()}
    return x * doubled["small"] + doubled["large"]


def test_dict_comprehension_over_python_values():
    check(dictcomp_of_floats, x48())


NAMES = ("query", "key", "value")


def dictcomp_over_tensors(ts):
    named = {name: torch.tanh(t) for name, t in zip(NAMES, ts)}
    return named["query"] * named["key"] + named["value"]


def test_dict_comprehension_over_tensors():
    check(dictcomp_over_tensors, tensors(3, 4, 4))


def setcomp(x):
    residues = {d % 4 for d in x.shape}
    return x * len(residues)


def test_set_comprehension_over_shape():
    check(setcomp, torch.randn(4, 8, 6))


def genexp_any(x):
    if any(d > 7 for d in x.shape):
        return x * 2
    return x


def genexp_all(x):
    if all(d % 2 == 0 for d in x.shape):
        return x + 1
    return x - 1


@pytest.mark.parametrize("fn", [genexp_any, genexp_all], ids=lambda f: f.__name__)
def test_any_all_of_generator_over_shape(fn):
    check(fn, x48())


def max_of_genexp(ts):
    widest = max(t.shape[-1] for t in ts)
    return ts[0] * widest


def test_max_of_generator_over_shapes():
    check(max_of_genexp, [torch.randn(2, 3), torch.randn(2, 7), torch.randn(2, 5)])


def filtered_listcomp(ts):
    evens = [t for i, t in enumerate(ts) if i % 2 == 0]
    out = evens[0]
    for t in evens[1:]:
        out = out - t
    return out


def test_list_comprehension_with_filter():
    check(filtered_listcomp, tensors(5, 3, 3))


def nested_listcomp(x):
    table = [[i * j for j in range(3)] for i in range(1, 3)]
    for row in table:
        x = x + sum(row)
    return x


def test_nested_list_comprehension():
    check(nested_listcomp, x48())


class MultiHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleList([nn.Linear(8, 4) for _ in range(3)])

    def forward(self, x):
        outs = [head(x) for head in self.heads]
        total = outs[0]
        for o in outs[1:]:
            total = total + o
        return total / len(outs)


def test_list_comprehension_over_module_list(no_grad):
    check(MultiHead(), x48())


def tuple_of_genexp(ts):
    return tuple(t + 1 for t in ts)


def test_tuple_of_generator_returned():
    check(tuple_of_genexp, tensors(3, 2, 3))


class SizedScales(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 0.5
        self.sizes = [1, 2, 3]

    def forward(self, x):
        factors = [s * self.scale for s in self.sizes]
        for f in factors:
            x = x * f
        return x


def test_list_comprehension_reading_self(no_grad):
    check(SizedScales(), x48())


def squeeze_by_comprehension(x):
    return x.reshape([d for d in x.shape if d != 1]) * 2


def test_list_comprehension_building_a_shape():
    check(squeeze_by_comprehension, torch.randn(4, 1, 8))


# ============================================================================================
# 4. inlining: nested functions, lambdas, closures, partials, forwarding, recursion
# ============================================================================================

def inner_closure_over_tensor(x, y):
    bias = y * 0.5

    def add_bias(t):
        return t + bias
    return add_bias(x) * add_bias(x * 2)


def test_nested_function_closing_over_a_tensor():
    check(inner_closure_over_tensor, x48(), torch.randn(8))


def inner_lambda(x):
    act = lambda t: t * torch.sigmoid(t)  # noqa: E731
    return act(x) + act(x * 2)


def test_lambda_defined_inside():
    check(inner_lambda, x48())


def inner_default_arg(x, scale):
    def scaled(t, s=scale):
        return t * s
    return scaled(x) + scaled(x, 3.0)


def test_nested_function_with_default_from_local():
    check(inner_default_arg, x48(), 0.25)


def inner_nonlocal(x):
    calls = 0

    def step(t):
        nonlocal calls
        calls += 1
        return torch.tanh(t) + calls
    y = step(step(x))
    return y * calls


def test_nested_function_with_nonlocal_counter():
    check(inner_nonlocal, x48())


def inner_recursive(x):
    def refine(t, depth):
        if depth == 0:
            return t
        return refine(t * 0.5 + 1, depth - 1)
    return refine(x, 3)


def test_recursive_nested_function():
    check(inner_recursive, x48())


def _leaky(x, slope=0.01):
    return torch.where(x > 0, x, x * slope)


leaky02 = functools.partial(_leaky, slope=0.2)


def uses_global_partial(x):
    return leaky02(x) * 2


def test_global_functools_partial():
    check(uses_global_partial, x48())


def _mix(a, b, alpha=0.5, beta=0.5):
    return a * alpha + b * beta


def local_partial(x, y):
    mix = functools.partial(_mix, x, beta=0.3)
    act = functools.partial(_leaky, slope=0.5)
    return act(mix(y))


def test_functools_partial_created_inside_over_a_tensor_is_captured():
    # a partial of a tensor is the closure kiln/_polyfills.py models, inlined into the graph
    check(local_partial, x48(), x48())


class PartialAct(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = functools.partial(_leaky, slope=0.3)

    def forward(self, x):
        return self.act(self.fc(x))


def test_partial_stored_on_module(no_grad):
    check(PartialAct(), x48())


def _affine(x, *, weight, bias=None, scale=1.0):
    y = x * weight
    if bias is not None:
        y = y + bias
    return y * scale


def _forward_kwargs(x, **kwargs):
    return _affine(x, **kwargs)


def forwards_tensor_kwargs(x, w, b):
    return _forward_kwargs(x, weight=w, bias=b, scale=0.5) + _forward_kwargs(x, weight=w)


def test_kwargs_with_tensors_forwarded():
    check(forwards_tensor_kwargs, x48(), torch.randn(8), torch.randn(8))


def _apply(fn, *args, **kwargs):
    return fn(*args, **kwargs)


def forwards_to_torch(x, y):
    return _apply(torch.add, x, y, alpha=2) + _apply(torch.relu, x)


def test_star_args_forwarded_to_torch_function():
    check(forwards_to_torch, x48(), x48())


def _logged(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper


@_logged
def _decorated_gelu(x):
    return F.gelu(x) * 1.5


def uses_decorated(x):
    return _decorated_gelu(x) + 1


def test_functools_wraps_decorated_helper():
    check(uses_decorated, x48())


def _is_even(x, n):
    return x if n == 0 else _is_odd(x * 0.5, n - 1)


def _is_odd(x, n):
    return x + 1 if n == 0 else _is_even(torch.tanh(x), n - 1)


def mutual_recursion(x):
    return _is_even(x, 4)


def test_mutual_recursion_with_constant_depth():
    check(mutual_recursion, x48())


class TreeNode(nn.Module):
    def __init__(self, depth):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.child = TreeNode(depth - 1) if depth > 0 else None

    def forward(self, x):
        h = torch.tanh(self.fc(x))
        if self.child is not None:
            h = h + self.child(h)
        return h


def test_recursive_module_structure(no_grad):
    check(TreeNode(3), x48())


def _make_act(name):
    if name == "swish":
        def act(t):
            return t * torch.sigmoid(t)
        return act
    return torch.relu


def factory_called_inside(x):
    return _make_act("swish")(x) + _make_act("relu")(x)


def test_function_factory_called_inside():
    check(factory_called_inside, x48())


ACTS = {"relu": torch.relu, "gelu": F.gelu, "leaky": _leaky}


def dict_of_functions(x, name):
    return ACTS[name](x) * 2


@pytest.mark.parametrize("name", ["gelu", "leaky"])
def test_function_looked_up_in_dict(name):
    check(dict_of_functions, x48(), name)


class Scaler:
    def __init__(self, s):
        self.s = s

    def __call__(self, x):
        return x * self.s + 1


SCALER = Scaler(0.75)


def calls_callable_object(x):
    return SCALER(x) - SCALER(x * 2)


def test_call_of_plain_callable_object():
    check(calls_callable_object, x48())


class Ops:
    factor = 3.0

    @staticmethod
    def square_plus(t):
        return t * t + 1

    @classmethod
    def scaled(cls, t):
        return t * cls.factor


def static_and_classmethods(x):
    return Ops.square_plus(x) + Ops.scaled(x) + Ops().scaled(x)


def test_staticmethod_and_classmethod_of_plain_class():
    check(static_and_classmethods, x48())


class Affine:
    def __init__(self):
        self.a, self.b = 2.0, -1.0

    def apply(self, t):
        return t * self.a + self.b


AFFINE = Affine()


def bound_method_in_variable(x):
    f = AFFINE.apply
    return f(f(x))


def test_bound_method_held_in_a_local():
    check(bound_method_in_variable, x48())


def lambdas_with_loop_defaults(x):
    fs = [lambda t, k=k: t * k for k in range(1, 4)]
    for f in fs:
        x = f(x) + 1
    return x


def test_lambdas_capturing_loop_variable_by_default():
    check(lambdas_with_loop_defaults, x48())


class ClosureOverSelf(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.alpha = 0.3

    def forward(self, x):
        def block(t):
            return torch.relu(self.fc(t)) * self.alpha + t
        return block(block(x))


def test_nested_function_closing_over_self(no_grad):
    check(ClosureOverSelf(), x48())


# ============================================================================================
# 5. builtins
# ============================================================================================

def len_of_containers(x, ts):
    names = ("a", "bb")
    d = {"k": 1, "j": 2, "l": 3}
    return x * len(ts) + len(names) + len(d) + len("abcd")


def test_len_of_list_tuple_dict_str():
    check(len_of_containers, x48(), tensors(3, 2))


class OptionalAttrs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        scale = getattr(self, "scale", 2.0)
        h = self.fc(x) * scale
        if hasattr(self, "fc"):
            h = h + 1
        if hasattr(self, "missing"):
            h = h * 100
        return h


def test_getattr_with_default_and_hasattr(no_grad):
    check(OptionalAttrs(), x48())


def setattr_on_namespace(x):
    ns = types.SimpleNamespace(scale=2.0)
    setattr(ns, "shift", 0.5)
    ns.scale = ns.scale * 3
    return x * ns.scale + getattr(ns, "shift")


def test_setattr_on_local_namespace_runs_in_python():
    runs_in_python(setattr_on_namespace, lambda: (x48(),), "SimpleNamespace")


class State:
    def __init__(self):
        self.total = None
        self.steps = 0


def setattr_on_local_object(x):
    st = State()
    for k in range(3):
        y = torch.sin(x + k)
        st.total = y if st.total is None else st.total + y
        setattr(st, "steps", st.steps + 1)
    return st.total / st.steps


def test_setattr_on_local_user_object_is_captured():
    # setattr(obj, name, v) on an object made in the frame is the attribute store obj.name = v
    check(setattr_on_local_object, x48())


def min_max_abs_sum(x):
    sizes = [3, -7, 5]
    return x * min(sizes) + max(sizes) - abs(sizes[1]) + sum(sizes) + min(2.5, 1.5, 4.0)


def test_min_max_abs_sum_over_python_values():
    check(min_max_abs_sum, x48())


def any_all_python(x, flags):
    if any(flags):
        x = x + 1
    if all(flags):
        x = x * 3
    return x


@pytest.mark.parametrize("flags", [(True, False), (True, True), (False, False)], ids=["mixed", "all", "none"])
def test_any_all_over_python_bools(flags):
    check(any_all_python, x48(), flags)


def uses_round(x):
    keep = round(x.shape[-1] * 0.3)
    return x * keep + round(2.567, 2)


def test_round_of_python_values():
    check(uses_round, x48())


def int_float_of_shapes(x):
    half = int(x.shape[-1] / 2)
    scale = float(x.shape[0])
    return x.reshape(x.shape[0], half, 2).sum(dim=-1) / scale


def test_int_and_float_of_shape_values():
    check(int_float_of_shapes, x48())


def tuple_list_of_shape(x):
    shape = list(x.shape)
    shape[-1] = shape[-1] // 2
    shape.append(2)
    return x.reshape(tuple(shape)).sum(dim=-1)


def test_tuple_and_list_of_shape():
    check(tuple_list_of_shape, x48())


def dict_constructor(x, y):
    d = dict(scale=2.0, shift=-1.0)
    t = dict(zip(("a", "b"), (x, y)))
    return t["a"] * d["scale"] + t["b"] + d["shift"]


def test_dict_constructor_keywords_and_zip():
    check(dict_constructor, x48(), x48())


def set_constructor(x, mode):
    allowed = set(["relu", "gelu"])
    if mode in allowed:
        return torch.relu(x)
    return x * 2


@pytest.mark.parametrize("mode", ["relu", "tanh"])
def test_set_constructor_and_in(mode):
    check(set_constructor, x48(), mode)


def sorted_keys(x):
    for k in sorted(SCALES):
        x = x * SCALES[k] + len(k)
    return x


def test_sorted_over_dict_keys():
    check(sorted_keys, x48())


class ActBase(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def act(self, h):
        return torch.relu(h)

    def forward(self, x):
        return self.act(self.fc(x))


class SuperMethod(ActBase):
    def act(self, h):
        return super().act(h) * 2 + 1


class TwoArgSuper(ActBase):
    def forward(self, x):
        return super(TwoArgSuper, self).forward(x) - x


class SuperChain(SuperMethod):
    def act(self, h):
        return super().act(h) + torch.tanh(h)


class SuperInInit(ActBase):
    def __init__(self):
        super().__init__()
        self.scale = 0.5

    def forward(self, x):
        return super().forward(x * self.scale)


@pytest.mark.parametrize("cls", [SuperMethod, TwoArgSuper, SuperChain, SuperInInit], ids=lambda c: c.__name__)
def test_super_calls(no_grad, cls):
    check(cls(), x48())


def pow_and_math(x):
    d = x.shape[-1]
    return x * pow(d, 2) + math.floor(d / 3) - math.ceil(d / 3)


def test_pow_builtin_and_floor_ceil():
    check(pow_and_math, x48())


def type_and_callable(x, act):
    if type(x) is torch.Tensor and callable(act):
        return act(x)
    return x


def test_type_is_and_callable():
    # type() of an input is its class, which the input's guard checks
    check(type_and_callable, x48(), torch.tanh)


def max_sum_of_shape(x):
    return x * max(x.shape) + sum(x.shape)


def test_max_and_sum_of_torch_size():
    check(max_sum_of_shape, torch.randn(3, 5))


def bool_str_of_values(x, n):
    tag = str(n)
    if bool(n) and tag == "3":
        return x * n
    return x


def test_bool_and_str_of_python_values():
    check(bool_str_of_values, x48(), 3)


def builtin_sum_of_tensors(a, b, c):
    return sum([a, b, c]) * 0.5


def test_builtin_sum_of_list_of_tensors():
    check(builtin_sum_of_tensors, x48(), x48(), x48())


def isinstance_list_argument(x, extra):
    if isinstance(extra, list):
        for t in extra:
            x = x + t
    return x


def test_isinstance_of_list_argument():
    check(isinstance_list_argument, x48(), tensors(2, 4, 8))


def zip_star_transpose(pairs):
    firsts, seconds = zip(*pairs)
    return firsts[0] * seconds[0] + firsts[1] * seconds[1]


def test_zip_star_transposes_pairs():
    check(zip_star_transpose, [(torch.randn(3), torch.randn(3)), (torch.randn(3), torch.randn(3))])


def map_builtin(ts):
    outs = list(map(torch.tanh, ts))
    return outs[0] + outs[1] + outs[2]


def test_map_over_tensors():
    check(map_builtin, tensors(3, 2, 4))


def filter_builtin(x):
    dims = list(filter(lambda d: d > 2, x.shape))
    return x * len(dims)


def test_filter_with_lambda_over_shape():
    check(filter_builtin, torch.randn(2, 3, 4))


# ============================================================================================
# 6. containers
# ============================================================================================

def list_negative_index(x):
    outs = [x, x * 2, x * 3]
    return outs[-1] - outs[-2]


def test_list_negative_index():
    check(list_negative_index, x48())


def slice_from_second(ts):
    out = ts[0] * 0
    for t in ts[1:]:
        out = out + t
    return out


def slice_reversed(ts):
    out = ts[0] * 0
    for i, t in enumerate(ts[::-1]):
        out = out + t * i
    return out


def slice_drop_last(ts):
    head = ts[:-1]
    return head[0] * head[-1] + len(head)


@pytest.mark.parametrize("fn", [slice_from_second, slice_reversed, slice_drop_last], ids=lambda f: f.__name__)
@pytest.mark.parametrize("kind", [tuple, list], ids=["tuple", "list"])
def test_slicing_of_tuple_and_list(kind, fn):
    check(fn, kind(tensors(4, 3, 3)))


def unpack_pair(pair):
    a, b = pair
    return a * b + a


def test_unpack_tuple_argument():
    check(unpack_pair, (torch.randn(3, 3), torch.randn(3, 3)))


def nested_unpack(x, y, z):
    (a, b), c = (x, y), z
    return a - b * c


def test_nested_unpacking():
    check(nested_unpack, x48(), x48(), x48())


def star_unpack_rest(xs):
    a, *rest = xs
    for r in rest:
        a = a + r
    return a


def star_unpack_middle(xs):
    first, *mid, last = xs
    return first * last + len(mid)


def star_unpack_init(xs):
    *init, last = xs
    return init[0] + last


@pytest.mark.parametrize("fn", [star_unpack_rest, star_unpack_middle, star_unpack_init], ids=lambda f: f.__name__)
def test_star_unpacking_of_list_of_tensors(fn):
    check(fn, tensors(4, 3, 3))


BASE_OPTS = {"scale": 2.0, "shift": 0.5}


def dict_merge(x, overrides_scale):
    opts = {**BASE_OPTS, **{"scale": overrides_scale}}
    return x * opts["scale"] + opts["shift"]


def test_dict_merge_with_double_star():
    check(dict_merge, x48(), 3.0)


def dict_get(x):
    opts = BASE_OPTS
    return x * opts.get("scale", 1.0) + opts.get("missing", -1.0)


def test_dict_get_with_default():
    check(dict_get, x48())


def in_tests(x, name):
    if name in BASE_OPTS:
        x = x * 2
    if name not in ("a", "b"):
        x = x + 1
    if "shift" in BASE_OPTS.keys():
        x = x - BASE_OPTS["shift"]
    return x


@pytest.mark.parametrize("name", ["scale", "a"])
def test_in_and_not_in(name):
    check(in_tests, x48(), name)


def dict_update_setdefault(x):
    opts = {"scale": 1.0}
    opts.update(shift=0.25)
    opts.setdefault("scale", 100.0)
    opts.setdefault("power", 2)
    opts["scale"] += 1.5
    return (x * opts["scale"] + opts["shift"]) ** opts["power"]


def test_dict_update_setdefault_and_augmented_item():
    check(dict_update_setdefault, x48())


def list_methods(x):
    outs = [x]
    outs.extend([x * 2, x * 3])
    outs.insert(0, x - 1)
    last = outs.pop()
    return outs[0] + outs[-1] + last + len(outs)


def test_list_extend_insert_pop():
    check(list_methods, x48())


def tuple_concat(x, rest):
    all_ts = (x,) + tuple(rest)
    out = all_ts[0]
    for t in all_ts[1:]:
        out = out * t
    return out


def test_tuple_concatenation():
    check(tuple_concat, x48(), tensors(2, 4, 8))


def list_repeat(x):
    scales = [0.5] * 3 + [2.0]
    for s in scales:
        x = x * s
    return x


def test_list_repetition_and_concat():
    check(list_repeat, x48())


def star_shape_in_reshape(x):
    return x.reshape(*x.shape[:-1], 2, -1).sum(dim=-1)


def test_star_of_shape_slice_in_method_call():
    check(star_shape_in_reshape, torch.randn(2, 3, 8))


def size_plus_tuple(x):
    return x.reshape(x.shape[:-1] + (2, -1)).mean(dim=-2)


def test_torch_size_slice_plus_tuple():
    check(size_plus_tuple, torch.randn(2, 3, 8))


def store_subscript_dict(x):
    out = {}
    out["relu"] = torch.relu(x)
    out["tanh"] = torch.tanh(x)
    return out["relu"] + out["tanh"], len(out)


def test_building_a_dict_by_item_assignment():
    check(store_subscript_dict, x48())


def list_sort_reverse(x):
    sizes = [3, 1, 2]
    sizes.sort()
    sizes.reverse()
    return x * sizes[0] + sizes[-1]


def test_list_sort_and_reverse():
    check(list_sort_reverse, x48())


def swap(x, y):
    a, b = x, y
    for _ in range(3):
        a, b = b, a * 0.5
    return a - b


def test_swap_by_tuple_assignment():
    check(swap, x48(), x48())


def del_items(x):
    opts = {"scale": 2.0, "debug": True}
    del opts["debug"]
    vals = [1.0, 2.0, 3.0]
    del vals[0]
    return x * opts["scale"] * len(opts) + vals[0]


def test_del_of_dict_key_and_list_item():
    check(del_items, x48())


def set_add_discard(x):
    seen = {1, 2}
    seen.add(5)
    seen.discard(1)
    return x * len(seen) + max(seen)


def list_remove(x):
    sizes = [4.0, 1.0, 2.0]
    sizes.remove(1.0)
    return x * sizes[1]


def dict_clear(x):
    opts = {"scale": 1.0}
    opts.clear()
    opts["shift"] = 2.0
    return x * opts["shift"] + len(opts)


def dict_pop(x):
    opts = {"scale": 2.0, "shift": 1.0}
    scale = opts.pop("scale")
    return x * scale + len(opts) + opts.pop("missing", 0.5)


def list_clear_and_item_assignment(x):
    vals = [3.0, 1.0]
    vals.clear()
    vals.append(7.0)
    vals += [5.0]
    vals[0] = 4.0
    return x * vals[-1] * vals[0]


@pytest.mark.parametrize("fn", [set_add_discard, list_remove, dict_clear, dict_pop, list_clear_and_item_assignment],
                         ids=lambda f: f.__name__)
def test_mutating_methods_of_local_containers(fn):
    check(fn, x48())


# ============================================================================================
# 7. Python number arithmetic, shape arithmetic
# ============================================================================================

def uses_divmod(x):
    q, r = divmod(x.shape[-1], 3)
    return x * q + r


def test_divmod_of_shape():
    check(uses_divmod, x48())


def modulo_shape(x):
    pad = (4 - x.shape[-1] % 4) % 4
    return x * (pad + 1)


def test_modulo_of_shape():
    check(modulo_shape, torch.randn(3, 6))


def unary_negation(x):
    n = x.dim()
    return x.transpose(-n, -1).sum(dim=-(n - 1))


def test_unary_negation_of_int():
    check(unary_negation, torch.randn(3, 4))


def chained_compare(x, n):
    if 0 < n < 10:
        return x * n
    return x


@pytest.mark.parametrize("n", [3, 12])
def test_chained_comparison(n):
    check(chained_compare, x48(), n)


def inverse_sqrt_size(x):
    return x.softmax(dim=-1) * x.size(-1) ** -0.5


def test_size_to_negative_power():
    check(inverse_sqrt_size, x48())


class ScaledDotProduct(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x):
        q, k, v = self.qkv(x).reshape(x.shape[0], 3, x.shape[-1]).transpose(0, 1)
        d = q.shape[-1]
        scores = q @ k.t() / math.sqrt(d)
        return scores.softmax(dim=-1) @ v


def test_math_sqrt_scale_and_unpacking_a_tensor(no_grad):
    check(ScaledDotProduct(), x48())


def log_exp_of_shape(x):
    return x * math.log(x.shape[0]) + math.exp(-x.shape[1] / 8)


def test_math_log_and_exp_of_shape():
    check(log_exp_of_shape, x48())


def true_division_of_ints(x):
    ratio = x.shape[0] / x.shape[1]
    return x * ratio + 1 / (1 + x.dim())


def test_true_division_of_shape_ints():
    check(true_division_of_ints, x48())


def bitwise_ints(x):
    n = x.shape[-1]
    return x * (n & 3) + (n >> 1) + (n << 2) + (n | 1) + (n ^ 5)


def test_bitwise_ops_on_shape_ints():
    check(bitwise_ints, x48())


def prod_of_shape(x):
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1]).sum(dim=0)


def test_math_prod_of_shape():
    check(prod_of_shape, torch.randn(2, 3, 4))


def augmented_python_numbers(x):
    s = 1.0
    n = x.shape[0]
    s *= 0.5
    s += n
    n //= 2
    n **= 2
    return x * s + n


def test_augmented_assignment_of_python_numbers():
    check(augmented_python_numbers, x48())


def numel_floordiv(x):
    per_row = x.numel() // x.shape[0]
    return x.reshape(x.shape[0], per_row).mean(dim=-1)


def test_numel_floordiv_shape():
    check(numel_floordiv, torch.randn(3, 2, 4))


def gelu_tanh_by_hand(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def test_math_pi_constant():
    check(gelu_tanh_by_hand, x48())


class HiddenFromRatio(nn.Module):
    def __init__(self, dim=8, ratio=2.5):
        super().__init__()
        hidden = max(1, int(dim * ratio) // 4 * 4)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)
        self.ratio = ratio

    def forward(self, x):
        groups = max(1, self.up.out_features // 4)
        h = self.up(x).reshape(x.shape[0], groups, -1).softmax(dim=-1).reshape(x.shape[0], -1)
        return self.down(h) * (1 / self.ratio)


def test_max_and_floordiv_of_module_sizes(no_grad):
    check(HiddenFromRatio(), x48())


def int_pow_and_float_mod(x, n):
    return x * 2 ** n + 7.5 % 2.0 - (-7) // 2


def test_int_power_and_float_modulo():
    check(int_pow_and_float_mod, x48(), 3)


def float_comparisons(x, p):
    if not p > 0.5 and p != 0.0:
        return x * p
    return x


@pytest.mark.parametrize("p", [0.25, 0.75])
def test_not_and_float_comparisons(p):
    check(float_comparisons, x48(), p)


# ============================================================================================
# 8. formatting and asserts on constants
# ============================================================================================

class FStringModuleDict(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleDict({f"layer{i}": nn.Linear(8, 8) for i in range(3)})

    def forward(self, x):
        for i in range(3):
            x = torch.relu(self.layers[f"layer{i}"](x))
        return x


def test_fstring_module_dict_key(no_grad):
    check(FStringModuleDict(), x48())


class GetattrFString(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc0 = nn.Linear(8, 8)
        self.fc1 = nn.Linear(8, 8)

    def forward(self, x):
        for i in range(2):
            x = torch.tanh(getattr(self, f"fc{i}")(x))
        return x


def test_getattr_with_fstring_name(no_grad):
    check(GetattrFString(), x48())


GAINS = {"block_0": 0.5, "block_1": 1.5, "block_02": 2.0, "stage-1": 3.0, "enc_dec": -1.0}


def str_format_key(x):
    for i in range(2):
        x = x * GAINS["block_{}".format(i)]
    return x


def percent_format_key(x):
    return x * GAINS["stage-%d" % 1]


def fstring_format_spec(x):
    return x * GAINS[f"block_{2:02d}"]


def concat_str_key(x):
    return x * GAINS["block_" + str(1)]


def join_key(x):
    return x * GAINS["_".join(["enc", "dec"])]


@pytest.mark.parametrize("fn", [str_format_key, percent_format_key, fstring_format_spec, concat_str_key, join_key],
                         ids=lambda f: f.__name__)
def test_string_building_for_keys(fn):
    check(fn, x48())


def assert_with_fstring(x):
    assert x.dim() == 2, f"bad {x.shape}"
    assert x.shape[-1] % 2 == 0, "last dim must be even, got %d" % x.shape[-1]
    return x.reshape(x.shape[0], -1, 2).sum(dim=-1)


def test_assert_with_formatted_messages_not_taken():
    check(assert_with_fstring, x48())


class CheckedInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.dim = 8
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        assert isinstance(x, torch.Tensor), f"expected a tensor, got {type(x).__name__}"
        assert x.shape[-1] == self.dim, f"expected last dim {self.dim}, got {x.shape[-1]} ({x.shape!r})"
        return self.fc(x)


def test_module_asserts_with_fstring_messages(no_grad):
    check(CheckedInput(), x48())


ENC_NAMES = ["enc_a", "dec_b", "enc_c"]
ENC_SCALE = {"enc_a": 0.5, "dec_b": 3.0, "enc_c": 2.0}


def startswith_filter(x):
    for name in ENC_NAMES:
        if name.startswith("enc"):
            x = x * ENC_SCALE[name]
    return x


def test_str_startswith_filter():
    check(startswith_filter, x48())


def fstring_conversions(x, mode):
    key = f"{mode!s}".upper()
    if key == "FAST":
        return x * 2
    return x + 1


@pytest.mark.parametrize("mode", ["fast", "slow"])
def test_fstring_conversion_and_str_methods(mode):
    check(fstring_conversions, x48(), mode)


def raise_not_taken(x, kind):
    if kind not in ("sum", "mean"):
        raise ValueError("unknown reduction %r for shape %s" % (kind, tuple(x.shape)))
    return x.sum(dim=-1) if kind == "sum" else x.mean(dim=-1)


def test_raise_with_percent_message_not_taken():
    check(raise_not_taken, x48(), "mean")


# ============================================================================================
# 9. grad mode blocks
# ============================================================================================

class EmaTarget(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        with torch.no_grad():
            target = torch.tanh(h) * 0.5
        return h - target


def test_no_grad_block_inside_module_forward(no_grad):
    check(EmaTarget(), x48())


def enable_grad_block(x):
    with torch.enable_grad():
        y = x * 2 + 1
    return y.sigmoid()


def test_enable_grad_block_inside():
    check(enable_grad_block, x48())


def nested_grad_blocks(x):
    with torch.enable_grad():
        y = x.exp()
        with torch.no_grad():
            z = y * 3
    return y + z


def test_nested_no_grad_inside_enable_grad():
    check(nested_grad_blocks, x48())


def set_grad_enabled_block(x):
    with torch.set_grad_enabled(False):
        y = torch.relu(x)
    return y * 2


def test_set_grad_enabled_block_is_captured():
    check(set_grad_enabled_block, x48())


@torch.no_grad()
def _no_grad_helper(t):
    return t * 2 - 1


def calls_no_grad_decorated(x):
    return _no_grad_helper(x) + x


def test_no_grad_decorated_helper():
    check(calls_no_grad_decorated, x48())


def grad_enabled_branch(x):
    if torch.is_grad_enabled():
        return x * 2
    return x * 3


def test_branch_on_is_grad_enabled():
    check(grad_enabled_branch, x48())
    with torch.no_grad():
        check(grad_enabled_branch, x48())


# ============================================================================================
# 10. in-place ops on intermediates
# ============================================================================================

def setitem_column(x):
    y = x * 2
    y[:, 0] = 0
    return y + 1


def setitem_mask(x):
    y = x + 1
    y[y < 0.5] = 0
    return y


def setitem_ellipsis_inplace_mul(x):
    y = torch.tanh(x)
    y[..., :2] *= 2
    return y


def setitem_slice_from_tensor(x):
    y = x * 3
    y[:, 1:3] = x[:, :2]
    return y


def setitem_row(x):
    y = x.exp()
    y[0] = 1.0
    return y


@pytest.mark.parametrize("fn", [setitem_column, setitem_mask, setitem_slice_from_tensor, setitem_row],
                         ids=lambda f: f.__name__)
def test_indexed_assignment_on_intermediate(fn):
    check(fn, x48())


def test_inplace_update_of_a_slice_is_captured():
    # y[..., 1:] *= 2 updates a view of y, a tensor the graph made: scattered into y's copy
    check(setitem_ellipsis_inplace_mul, x48())


class AugmentedLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        y += x
        y *= 0.5
        return y


def test_augmented_assignment_on_module_intermediate(no_grad):
    check(AugmentedLinear(), x48())


def div_and_sub_alpha(x, y):
    h = x * 1.5
    h.div_(x.shape[-1])
    h.sub_(y, alpha=2)
    return h


def clamp_inplace(x):
    h = x * 3
    h.clamp_(min=-1.0, max=1.0)
    return h


def masked_fill_inplace(x):
    h = x * 2
    h.masked_fill_(h > 1, 1.0)
    return h


def zero_and_fill(x):
    acc = x * 1
    acc.zero_()
    bias = x * 1
    bias.fill_(0.5)
    return acc + x + bias


def copy_inplace(x, y):
    buf = x * 0
    buf.copy_(y)
    return buf * 2


def functional_relu_inplace(x):
    h = x - 0.5
    F.relu(h, inplace=True)
    return h * 2


def torch_relu_(x):
    h = x * 2
    torch.relu_(h)
    return h + 1


def tanh_inplace_chain(x):
    h = x * 0.5
    return h.tanh_().mul_(2).add_(1)


@pytest.mark.parametrize("fn", [div_and_sub_alpha, clamp_inplace, masked_fill_inplace, copy_inplace,
                                functional_relu_inplace, torch_relu_, tanh_inplace_chain, zero_and_fill],
                         ids=lambda f: f.__name__)
def test_inplace_methods_on_intermediates(fn):
    n = fn.__code__.co_argcount
    check(fn, *[x48() for _ in range(n)])


def inplace_on_list_item(x):
    ts = [x * 1, x * 2]
    ts[0] += 1
    ts[1] *= ts[0]
    return ts[0] + ts[1]


def test_augmented_assignment_on_list_item():
    check(inplace_on_list_item, x48())


def inplace_on_object_attribute(x):
    st = State()
    st.total = x * 0
    for k in range(3):
        st.total += torch.sin(x * k)
    return st.total


def test_augmented_assignment_on_local_object_attribute():
    check(inplace_on_object_attribute, x48())


# ============================================================================================
# 11. user classes, dataclasses, enums, properties
# ============================================================================================

@dataclasses.dataclass
class NormConfig:
    hidden: int = 8
    eps: float = 1e-5
    affine_scale: float = 1.5


NORM_CFG = NormConfig()


def dataclass_norm(x):
    y = F.layer_norm(x, (NORM_CFG.hidden,), eps=NORM_CFG.eps)
    return y * NORM_CFG.affine_scale


def test_dataclass_config_fields():
    check(dataclass_norm, x48())


@dataclasses.dataclass(frozen=True)
class FrozenCfg:
    scale: float
    act: str = "tanh"


def frozen_cfg_arg(x, cfg):
    y = x * cfg.scale
    return torch.tanh(y) if cfg.act == "tanh" else torch.relu(y)


def test_frozen_dataclass_argument():
    check(frozen_cfg_arg, x48(), FrozenCfg(0.5))


@dataclasses.dataclass
class InnerCfg:
    dim: int = 8
    drop: float = 0.0


@dataclasses.dataclass
class OuterCfg:
    model: InnerCfg = dataclasses.field(default_factory=InnerCfg)
    widths: list = dataclasses.field(default_factory=lambda: [1.0, 0.5])


OUTER = OuterCfg()


def nested_dataclass(x):
    x = x.reshape(-1, OUTER.model.dim)
    for w in OUTER.widths:
        x = x * w
    return x


def test_nested_dataclass_and_default_factory_list():
    check(nested_dataclass, torch.randn(2, 2, 8))


class Act(enum.Enum):
    RELU = "relu"
    TANH = "tanh"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 3


def enum_value(x):
    return x * Level.HIGH + Level.LOW * 2 + len(Act.TANH.value)


def test_enum_values_in_arithmetic():
    check(enum_value, x48())


class EnumActBlock(nn.Module):
    def __init__(self, act: Act):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = act

    def forward(self, x):
        h = self.fc(x)
        if self.act is Act.RELU:
            return torch.relu(h)
        return torch.tanh(h)


@pytest.mark.parametrize("act", list(Act), ids=lambda a: a.name)
def test_enum_identity_branch_in_module(no_grad, act):
    check(EnumActBlock(act), x48())


class Blocky(nn.Module):
    SCALE = 0.5
    EXTRA = 0.0

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x) * self.SCALE + Blocky.EXTRA


class BiggerBlocky(Blocky):
    SCALE = 4.0


@pytest.mark.parametrize("cls", [Blocky, BiggerBlocky], ids=lambda c: c.__name__)
def test_class_attributes(no_grad, cls):
    check(cls(), x48())


class Geometry:
    def __init__(self, heads, dim):
        self.heads = heads
        self.dim = dim

    @property
    def head_dim(self):
        return self.dim // self.heads

    @functools.cached_property
    def scale(self):
        return self.head_dim ** -0.5


GEOM = Geometry(2, 8)


def property_and_cached_property(x):
    return x.reshape(x.shape[0], GEOM.heads, GEOM.head_dim).softmax(dim=-1) * GEOM.scale


def test_property_and_cached_property():
    check(property_and_cached_property, x48())


class TinyCfg(typing.NamedTuple):
    dim: int
    scale: float = 2.0


TINY = TinyCfg(8)


def namedtuple_cfg(x):
    d, s = TINY
    return x.reshape(-1, TINY.dim) * s + d


def test_namedtuple_config():
    check(namedtuple_cfg, torch.randn(2, 2, 8))


NS_CFG = types.SimpleNamespace(scale=0.25, layers=2)


def namespace_cfg(x):
    for _ in range(NS_CFG.layers):
        x = torch.sin(x) * NS_CFG.scale + x
    return x


def test_simple_namespace_config():
    check(namespace_cfg, x48())


@dataclasses.dataclass
class Built:
    scale: float
    shift: float

    @classmethod
    def default(cls):
        return cls(scale=2.0, shift=-0.5)


def dataclass_built_inside(x):
    cfg = Built.default()
    other = Built(0.5, 1.0)
    return x * cfg.scale + cfg.shift + x * other.scale


def test_dataclass_instances_built_inside():
    check(dataclass_built_inside, x48())


class Slotted:
    __slots__ = ("alpha", "beta")

    def __init__(self, alpha, beta):
        self.alpha = alpha
        self.beta = beta


SLOTTED = Slotted(0.5, 2.0)


def slotted_cfg(x):
    return x * SLOTTED.alpha + SLOTTED.beta


def test_slots_class_config():
    check(slotted_cfg, x48())


class CfgModule(nn.Module):
    def __init__(self, cfg: NormConfig):
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(cfg.hidden, cfg.hidden)

    def forward(self, x):
        return F.layer_norm(self.fc(x), (self.cfg.hidden,), eps=self.cfg.eps) * self.cfg.affine_scale


def test_dataclass_config_field_changed_between_calls(no_grad):
    def change(m):
        m.cfg.affine_scale = -3.0
    check_after_change(CfgModule(NormConfig()), x48(), change)


# ============================================================================================
# 12. nn.Module: parameters, buffers, hooks, changes between calls
# ============================================================================================

class DirectParams(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 8) * 0.3)
        self.bias = nn.Parameter(torch.randn(6))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias) + x @ self.weight.t()


def test_parameters_used_directly_with_f_linear(no_grad):
    check(DirectParams(), x48())


class WithBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.randn(8))
        self.register_buffer("inv_std", torch.rand(8) + 0.5)

    def forward(self, x):
        return (x - self.mean) * self.inv_std


def test_registered_buffers(no_grad):
    check(WithBuffer(), x48())


class TiedEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.fc = nn.Linear(8, 8)

    def forward(self, idx):
        h = torch.tanh(self.fc(self.embed(idx)))
        return F.linear(h, self.embed.weight)


def test_tied_embedding_weight(no_grad):
    check(TiedEmbedding(), torch.randint(0, 10, (2, 5)))


class SubmoduleSizes(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 12)

    def forward(self, x):
        h = self.fc(x)
        return h.reshape(x.shape[0], self.fc.out_features // 4, 4).sum(dim=-1) * self.fc.weight.shape[1]


def test_submodule_attributes_in_shape_arithmetic(no_grad):
    check(SubmoduleSizes(), x48())


class HookedStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(2)])

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def _scale_output_hook(module, inputs, output):
    return output * 0.5 + 1


def _shift_input_pre_hook(module, inputs):
    (x,) = inputs
    return (x - 0.25,)


def _kw_pre_hook(module, args, kwargs):
    return (args[0] * 2,), kwargs


def test_forward_hook_on_module_list_element(no_grad):
    model = HookedStack()
    model.layers[1].register_forward_hook(_scale_output_hook)
    check(model, x48())


def test_forward_pre_hook_on_submodule(no_grad):
    model = HookedStack()
    model.layers[0].register_forward_pre_hook(_shift_input_pre_hook)
    check(model, x48())


def test_forward_pre_hook_with_kwargs_on_submodule_runs_in_python(no_grad):
    model = HookedStack()
    model.layers[0].register_forward_pre_hook(_kw_pre_hook, with_kwargs=True)
    runs_in_python(model, lambda: (x48(),), "keyword arguments")


def test_forward_hook_on_the_compiled_module_itself(no_grad):
    model = HookedStack()
    model.register_forward_hook(_scale_output_hook)
    check(model, x48())


def test_forward_pre_hook_on_the_compiled_module_itself(no_grad):
    model = HookedStack()
    model.register_forward_pre_hook(_shift_input_pre_hook)
    check(model, x48())


def test_hook_added_between_calls(no_grad):
    def change(m):
        m.layers[0].register_forward_hook(_scale_output_hook)
    check_after_change(HookedStack(), x48(), change)


def test_hook_removed_between_calls(no_grad):
    model = HookedStack()
    handle = model.layers[1].register_forward_hook(_scale_output_hook)
    compiled = kiln.compile(model)
    same_as_eager(compiled, model, x48())
    handle.remove()
    fb = fallbacks()
    for _ in range(2):
        same_as_eager(compiled, model, x48())
    assert fallbacks() == fb, kiln.stats()["fallback_reasons"]
    check(model, x48())


class Routed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.main = nn.ReLU()
        self.aux = nn.Tanh()
        self.mode = "main"
        self.norm = None

    def forward(self, x):
        h = self.fc(x)
        h = self.main(h) if self.mode == "main" else self.aux(h)
        if self.norm is not None:
            h = self.norm(h)
        return h


def test_submodule_swapped_between_calls(no_grad):
    def change(m):
        m.main = nn.Sigmoid()
    check_after_change(Routed(), x48(), change)


def test_string_attribute_changed_between_calls(no_grad):
    def change(m):
        m.mode = "aux"
    check_after_change(Routed(), x48(), change)


def test_none_attribute_set_to_a_module_between_calls(no_grad):
    def change(m):
        m.norm = nn.LayerNorm(8)
    check_after_change(Routed(), x48(), change)


class RoutedDict(nn.Module):
    def __init__(self):
        super().__init__()
        self.acts = nn.ModuleDict({"main": nn.ReLU(), "aux": nn.Tanh()})
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.acts["main"](self.fc(x)) + self.acts["aux"](x)


def test_module_dict_entry_swapped_between_calls(no_grad):
    def change(m):
        m.acts["main"] = nn.Sigmoid()
    check_after_change(RoutedDict(), x48(), change)


class ScaleAttr(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.scale = 1.0

    def forward(self, x):
        return torch.tanh(self.fc(x) * self.scale)


def test_float_attribute_changed_between_calls(no_grad):
    def change(m):
        m.scale = 0.125
    check_after_change(ScaleAttr(), x48(), change)


class TrainFlagBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        return h * 2 if self.training else h - 1


class TwoFlagBlocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = TrainFlagBlock()
        self.b = TrainFlagBlock()

    def forward(self, x):
        return self.b(self.a(x))


def test_eval_of_a_submodule_between_calls(no_grad):
    def change(m):
        m.b.eval()
    check_after_change(TwoFlagBlocks().train(), x48(), change)


def test_train_after_eval_between_calls(no_grad):
    def change(m):
        m.train()
    check_after_change(TwoFlagBlocks().eval(), x48(), change)


def test_batchnorm_train_mode_updates_running_stats_in_the_graph(no_grad):
    # batch statistics in the graph; running_mean, running_var and num_batches_tracked written
    # back after it, equal to the eager copy's after every call
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU()).train()
    eager = copy.deepcopy(model)
    compiled = kiln.compile(model)
    for call in range(2):
        x = x48()
        assert_same(compiled(x), eager(x), path=f"wrong result (call {call}): out")
        assert_same(list(model.state_dict().values()), list(eager.state_dict().values()),
                    path=f"wrong result (call {call}): module state")
    assert int(model[1].num_batches_tracked) == 2
    e = kiln.explain(copy.deepcopy(model))(x48())
    assert e.graph_count == 1 and not e.break_reasons, _why(e)


class CountsCalls(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("calls", torch.zeros(()))
        self.register_buffer("ema", torch.zeros(8))

    def forward(self, x):
        h = self.fc(x)
        self.calls += 1
        self.ema.mul_(0.9).add_(h.mean(dim=0) * 0.1)
        return h - self.ema


def test_module_buffer_updated_in_place_in_forward(no_grad):
    # the buffers (calls, ema) are updated out of place in the graph and written back after it
    model = CountsCalls()
    ref = copy.deepcopy(model)
    e = kiln.explain(copy.deepcopy(model))(x48())
    assert e.graph_count == 1 and not e.break_reasons, _why(e)
    compiled = kiln.compile(model)
    for _ in range(3):
        x = x48()
        torch.testing.assert_close(compiled(x), ref(x))
        torch.testing.assert_close(model.ema, ref.ema)
    assert float(model.calls) == float(ref.calls) == 3.0


def test_parameter_replaced_with_new_shape_between_calls(no_grad):
    def change(m):
        m.fc = nn.Linear(8, 4)
    check_after_change(ScaleAttr(), x48(), change)


class DtypeFromParams(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        dtype = next(self.parameters()).dtype
        x = x.to(dtype)
        return self.fc(x).to(self.fc.weight.dtype)


def test_next_of_parameters_for_dtype_is_captured(no_grad):
    # self.parameters() is a list of trackers in torch's order (Interpreter::module_members)
    model = DtypeFromParams()
    x = torch.randn(4, 8, dtype=torch.float64)
    e = kiln.explain(model)(x)
    assert not e.break_reasons and e.graph_count == 1, _why(e)
    torch.testing.assert_close(kiln.compile(model)(x), model(x))


class KwargForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = ScaleAttr()

    def forward(self, x, *, temperature=1.0, residual=True):
        h = self.inner(x) / temperature
        return h + x if residual else h


def test_module_forward_keyword_defaults_and_overrides(no_grad):
    model = KwargForward()
    check(model, x48())
    compiled = kiln.compile(model)
    x = x48()
    e = kiln.explain(model)(x, temperature=0.5, residual=False)
    assert not e.break_reasons and e.graph_count == 1, _why(e)
    torch.testing.assert_close(compiled(x, temperature=0.5, residual=False), model(x, temperature=0.5, residual=False))


# ============================================================================================
# 13. graph breaks combined with the features above
# ============================================================================================

class PrintingTower(Tower):
    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = torch.relu(layer(x))
            print(f"layer {i}: {tuple(x.shape)}")  # break: tower-print
        return x


def test_break_print_inside_module_list_loop_runs_in_python(no_grad, capsys):
    runs_in_python(PrintingTower().eval(), lambda: (x48(),), "print", capsys=capsys)


def data_if_in_range_loop(x):
    for i in range(3):
        x = x * 0.5 + i
        if x.sum() > 0:  # break: loop-data-if
            x = -x
    return x


def test_break_data_dependent_if_inside_range_loop_runs_in_python():
    runs_in_python(data_if_in_range_loop, mk(4, 8), "data-dependent")


def item_then_shape_math(x):
    m = x.abs().max().item()  # break: item-shape
    half = x.shape[-1] // 2
    return x.reshape(x.shape[0], half, 2).sum(dim=-1) / (m + 1)


def test_break_item_then_shape_arithmetic():
    check_break(item_then_shape_math, mk(4, 8), "item-shape")


def print_after_no_grad_block(x):
    with torch.no_grad():
        y = x * 2
    print("after block")  # break: after-with
    return y + 1


def test_break_print_after_a_no_grad_block(capsys):
    check_break(print_after_no_grad_block, mk(4, 8), "after-with")


class PrintInNoGrad(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        with torch.no_grad():
            target = h.tanh()
            print("target", target.shape)  # break: in-with
        return h - target


def test_break_print_inside_no_grad_block_runs_in_python(no_grad, capsys):
    runs_in_python(PrintInNoGrad(), lambda: (x48(),), "print", capsys=capsys)


def dict_live_across_break(x):
    feats = {"a": x * 2, "b": x.exp()}
    print("dict", sorted(feats))  # break: dict-live
    return feats["a"] + feats["b"]


def test_break_with_dict_of_tensors_live(capsys):
    check_break(dict_live_across_break, mk(4, 8), "dict-live")


def list_live_then_star_unpack(x):
    parts = [x + 1, x * 2, x - 3]
    if parts[0].mean() > 0:  # break: list-live
        parts.append(x)
    first, *rest = parts
    for r in rest:
        first = first + r
    return first


def test_break_with_list_live_then_star_unpack():
    check_break(list_live_then_star_unpack, mk(4, 8), "list-live")


class PrintingModuleDict(Experts):
    def forward(self, x):
        out = x * 0
        for name, expert in self.experts.items():
            out = out + expert(x) * self.gates[name]
            print(f"expert {name}")  # break: mdict-print
        return out


def test_break_print_inside_module_dict_loop_runs_in_python(no_grad, capsys):
    runs_in_python(PrintingModuleDict(), lambda: (x48(),), "print", capsys=capsys)


class HookedWithBreak(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.out = nn.Linear(8, 8)

    def forward(self, x):
        h = torch.relu(self.fc(x))
        if h.sum() > 0:  # break: hooked-if
            h = h * 2
        return self.out(h)


def test_break_in_forward_with_a_hooked_submodule(no_grad):
    model = HookedWithBreak()
    model.out.register_forward_hook(_scale_output_hook)
    check_break(model, lambda: (x48(),), "hooked-if")


def _refine_with_break(x, depth):
    if depth == 0:
        return x
    if x.mean() > 0:  # break: recursion-if
        x = x - 0.5
    return _refine_with_break(x * 0.9, depth - 1)


def recursion_with_break(x):
    return _refine_with_break(x + 0.1, 3) * 2


def test_break_inside_constant_depth_recursion():
    check_break(recursion_with_break, mk(4, 8), "recursion-if")


def break_then_indexed_assignment(x):
    y = x * 2
    print("before setitem")  # break: setitem-print
    y[:, 0] = 0
    return y + 1


def test_break_then_indexed_assignment(capsys):
    check_break(break_then_indexed_assignment, mk(4, 8), "setitem-print")


def break_then_enum_config(x):
    y = RUN_MODE.scale * x
    s = y.sum().item()  # break: enum-item
    if RUN_MODE.act is Act.TANH:
        return torch.tanh(y) + s
    return torch.relu(y) - s


@dataclasses.dataclass
class RunMode:
    act: Act = Act.TANH
    scale: float = 0.5


RUN_MODE = RunMode()


def test_break_then_dataclass_and_enum_branch():
    check_break(break_then_enum_config, mk(4, 8), "enum-item")


def while_with_break_inside(x):
    i = 0
    while i < 3:
        x = torch.sin(x) + i
        print("step", i)  # break: while-print
        i += 1
    return x


def test_break_print_inside_while_loop_runs_in_python(capsys):
    runs_in_python(while_with_break_inside, mk(4, 8), "print", capsys=capsys)


def _noisy_leaky(x, slope=0.01):
    y = torch.where(x > 0, x, x * slope)
    print("leaky", slope)  # break: partial-print
    return y * 2


noisy_leaky02 = functools.partial(_noisy_leaky, slope=0.2)


def calls_partial_with_break(x):
    return noisy_leaky02(x + 1) - 1


def test_break_inside_a_partial(capsys):
    check_break(calls_partial_with_break, mk(4, 8), "partial-print")


def _affine_with_break(x, *, weight, bias=None):
    y = x * weight
    if y.mean() > 0:  # break: kwargs-if
        y = y - bias
    return y


def _forward_kwargs_with_break(x, **kwargs):
    return _affine_with_break(x, **kwargs)


def kwargs_forwarding_with_break(x, w, b):
    return _forward_kwargs_with_break(x * 2, weight=w, bias=b) + 1


def test_break_inside_kwargs_forwarded_function():
    check_break(kwargs_forwarding_with_break, lambda: (x48(), torch.randn(8), torch.randn(8)), "kwargs-if")


def tolist_then_python_sum(x):
    y = x.sum(dim=-1)
    vals = y.tolist()  # break: tolist
    return x * sum(vals) + len(vals)


def test_break_tolist_then_python_sum():
    check_break(tolist_then_python_sum, mk(4, 8), "tolist")


def float_of_tensor(x):
    y = torch.tanh(x)
    m = float(y.mean())  # break: float-of
    return y * m + 1


def test_break_float_of_a_tensor():
    check_break(float_of_tensor, mk(4, 8), "float-of")


def int_of_tensor(x):
    y = x * 3
    k = int(y.abs().sum() > 10)  # break: int-of
    return y * k + 1


def test_break_int_of_a_tensor():
    check_break(int_of_tensor, mk(4, 8), "int-of")


def bool_of_max(x):
    y = x - 0.5
    if y.max() > 1.0:  # break: max-if
        y = y / 2
    return y * 3


def test_break_branch_on_tensor_max():
    check_break(bool_of_max, mk(4, 8), "max-if")


def break_returns_tensor_and_python(x):
    y = torch.relu(x)
    n = int(y.gt(0).sum())  # break: return-mixed
    return y * 2, n


def test_break_returning_tensor_and_python_value():
    check_break(break_returns_tensor_and_python, mk(4, 8), "return-mixed")


def item_in_comprehension(ts):
    scaled = [t / (t.abs().sum().item() + 1) for t in ts]  # break: comp-item
    return scaled[0] + scaled[1]


def test_break_item_inside_comprehension_runs_in_python():
    runs_in_python(item_in_comprehension, lambda: (tensors(2, 3, 3),), "item")


def break_in_nested_closure(x):
    k = 1.5

    def inner(t):
        y = t * k
        print("inner", k)  # break: closure-print
        return y + k
    return inner(x) * 2


def test_break_inside_nested_closure(capsys):
    check_break(break_in_nested_closure, mk(4, 8), "closure-print")


class SuperWithBreak(ActBase):
    def act(self, h):
        h = super().act(h)
        if h.sum() > 1:  # break: super-if
            h = h * 0.5
        return h + 1


def test_break_in_method_calling_super(no_grad):
    check_break(SuperWithBreak(), lambda: (x48(),), "super-if")


class AttrAfterBreak(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.scale = 0.25
        self.heads = 2

    def forward(self, x):
        h = self.fc(x)
        print("fc done")  # break: attr-after
        return h.reshape(x.shape[0], self.heads, -1).softmax(dim=-1).reshape(x.shape[0], -1) * self.scale


def test_break_then_module_attributes_and_shape_math(no_grad, capsys):
    check_break(AttrAfterBreak(), lambda: (x48(),), "attr-after")


def fstring_print_with_format(x):
    y = x.exp()
    print("mean %.3f, shape %s" % (y.mean(), tuple(y.shape)))  # break: fmt-print
    return y - 1


def test_break_percent_formatting_of_a_tensor_in_print(capsys):
    check_break(fstring_print_with_format, mk(4, 8), "fmt-print")


def list_mutated_before_break(x):
    parts = [x + 1]
    parts.append(x * 2)
    print("parts", len(parts))  # break: list-before
    parts.append(x - 1)
    return parts[0] + parts[-1] * len(parts)


def dict_mutated_before_break(x):
    d = {"a": x}
    d["b"] = x * 3
    d["a"] = d["a"] - 1
    print("keys", list(d))  # break: dict-before
    return d["a"] + d["b"] * len(d)


def nonlocal_then_break(x):
    k = 1.0

    def bump():
        nonlocal k
        k += 2.0
    bump()
    print("k", k)  # break: nonlocal-print
    return x * k


def view_live_across_break(x):
    y = x * 2
    flat = y.view(-1)
    print("flat", flat.shape)  # break: view-live
    y.add_(1)
    return flat * 1


def iterator_live_across_break(ts):
    it = iter(ts)
    a = next(it)
    print("first")  # break: iter-live
    b = next(it)
    return a * b


def counter_then_break(x):
    n = x.shape[0]
    n += 3
    print("n", n)  # break: counter-print
    return x * n


def inplace_in_loop_then_break(x):
    ys = [x * 1, x * 2]
    for y in ys:
        y.add_(1)
    print("done")  # break: loop-inplace
    return ys[0] + ys[1]


def loop_list_then_item(x):
    acc = []
    for i in range(3):
        acc.append(x * i)
    s = acc[0].abs().sum().item()  # break: list-item
    return acc[1] * s + acc[2]


def sorted_then_break(x):
    order = sorted([3, 1, 2], reverse=True)
    if x.mean() > 0:  # break: sorted-if
        x = x * order[0]
    return x + order[-1]


@pytest.mark.parametrize("fn,tag", [
    (list_mutated_before_break, "list-before"),
    (dict_mutated_before_break, "dict-before"),
    (view_live_across_break, "view-live"),
    (counter_then_break, "counter-print"),
    (inplace_in_loop_then_break, "loop-inplace"),
    (loop_list_then_item, "list-item"),
    (sorted_then_break, "sorted-if"),
], ids=lambda v: v.__name__ if callable(v) else None)
def test_break_with_python_state_live(fn, tag, capsys):
    check_break(fn, mk(4, 8), tag)


@pytest.mark.parametrize("fn,tag", [
    (nonlocal_then_break, "nonlocal-print"),
], ids=lambda v: v.__name__ if callable(v) else None)
def test_break_with_python_state_live_runs_in_python(fn, tag, capsys):
    # tag names the marked line of the break kiln should split at once it captures this code.
    runs_in_python(fn, mk(4, 8), ("print", "nonlocal"), capsys=capsys)


def test_break_with_an_iterator_live_runs_in_python(capsys):
    runs_in_python(iterator_live_across_break, lambda: (tensors(3, 4, 8),), "print", capsys=capsys)


def python_number_types_as_dtypes(x):
    # torch's argument parser takes int, float and bool as dtypes (transformers' static cache
    # makes its position counter with dtype=int)
    n = torch.tensor(0, dtype=int) + x.shape[0]
    return x.sum(-1, dtype=float) + n, torch.zeros(2, dtype=bool), x.to(float) * 2


def test_python_number_types_as_dtypes():
    check(python_number_types_as_dtypes, x48())
