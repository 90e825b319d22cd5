"""Capture of the Python objects model code builds around its tensors: dataclass outputs,
attribute stores it undoes, registries, factories, imports, signature checks."""
import collections.abc
import dataclasses
import functools
import inspect
from collections import OrderedDict
from typing import Optional

import pytest
import torch

import kiln


def _one_graph(fn, *args, **kwargs):
    e = kiln.explain(fn)(*args, **kwargs)
    assert e.graph_count == 1 and not e.break_reasons, e
    return e


@dataclasses.dataclass
class Point:
    x: torch.Tensor
    y: Optional[torch.Tensor] = None
    scale: float = 2.0


class Output(OrderedDict):
    """transformers' ModelOutput protocol: a dict of the fields that are not None."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None:
                self[f.name] = v

    def __getitem__(self, k):
        return dict(self.items())[k] if isinstance(k, str) else self.to_tuple()[k]

    def __setitem__(self, k, v):
        super().__setitem__(k, v)
        super().__setattr__(k, v)

    def __setattr__(self, name, value):
        if name in {f.name for f in dataclasses.fields(self)} and value is not None:
            super().__setitem__(name, value)
        super().__setattr__(name, value)

    def to_tuple(self):
        return tuple(self[k] for k in self.keys())


@dataclasses.dataclass
class Out(Output):
    last: torch.Tensor = None
    pooled: Optional[torch.Tensor] = None
    hidden: Optional[tuple] = None


def test_dataclass_fields_read_and_returned():
    def f(a):
        p = Point(a.sin(), y=a.cos())
        q = Point(p.x * p.scale)
        return Point(q.x + p.y, scale=q.scale + 1.0)

    a = torch.randn(5)
    _one_graph(f, a)
    out, ref = kiln.compile(f)(a), f(a)
    assert type(out) is Point and out.scale == ref.scale and out.y is None
    torch.testing.assert_close(out.x, ref.x)


def test_mapping_dataclass_skips_none_fields():
    def f(a):
        o = Out(last=a.relu(), hidden=None)
        first = o[0] * 2
        o.pooled = a.mean(-1)
        n = len(o)
        return Out(last=first + o["pooled"].unsqueeze(-1) * n, pooled=o.to_tuple()[1])

    a = torch.randn(3, 4)
    _one_graph(f, a)
    out, ref = kiln.compile(f)(a), f(a)
    assert type(out) is Out and list(out.keys()) == list(ref.keys()) == ["last", "pooled"]
    for k in ref.keys():
        torch.testing.assert_close(out[k], ref[k])


def test_dataclass_isinstance_hasattr_getattr():
    def f(a):
        p = Point(a)
        k = 1.0 if isinstance(p, Point) and hasattr(p, "scale") and not hasattr(p, "nope") else 0.0
        return p.x * k + getattr(p, "scale") + getattr(p, "nope", 3.0)

    a = torch.randn(4)
    _one_graph(f, a)
    torch.testing.assert_close(kiln.compile(f)(a), f(a))


class Config:
    def __init__(self):
        self.is_causal = False
        self.scale = 1.5


CFG = Config()


def test_attribute_store_undone_before_return_is_captured():
    def run(a):
        return a * CFG.scale + (1.0 if CFG.is_causal else 0.0)

    def f(a):
        old = CFG.is_causal
        CFG.is_causal = True
        try:
            y = run(a)
        finally:
            CFG.is_causal = old
        return y

    a = torch.randn(4)
    _one_graph(f, a)
    torch.testing.assert_close(kiln.compile(f)(a), f(a))
    assert CFG.is_causal is False


def test_attribute_store_left_changed_is_replayed_after_the_graph():
    cfg, twin = Config(), Config()

    def f(a, c):
        c.scale = c.scale + 1.0
        return a * c.scale

    compiled = kiln.compile(f)
    for _ in range(3):
        a = torch.randn(4)
        torch.testing.assert_close(compiled(a, cfg), f(a, twin))
        assert cfg.scale == twin.scale  # stored once per call, as in Python
    assert cfg.scale == 4.5
    e = kiln.explain(f)(torch.randn(4), Config())
    assert e.graph_count == 1 and not e.break_reasons, e


class Cached(torch.nn.Module):
    """Keeps its last activation and a call count on itself, as some models do."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)
        self.last = None
        self.calls = 0

    def forward(self, x):
        h = torch.relu(self.fc(x))
        self.last = h * 2
        self.calls = self.calls + 1
        if hasattr(self, "stale"):
            del self.stale
        return h + 1


def test_tensor_and_counter_stored_on_a_module_are_replayed():
    m, twin = Cached().eval(), Cached().eval()
    twin.load_state_dict(m.state_dict())
    m.stale = twin.stale = 1
    compiled = kiln.compile(m)
    with torch.no_grad():
        x = torch.randn(3, 6)
        _one_graph(Cached().eval(), x)
        out = compiled(x)
        torch.testing.assert_close(out, twin(x))
        torch.testing.assert_close(m.last, twin.last)
        assert m.calls == twin.calls == 1 and not hasattr(m, "stale")
        x2 = torch.randn(3, 6)
        torch.testing.assert_close(compiled(x2), twin(x2))
        torch.testing.assert_close(m.last, twin.last)
        assert m.calls == twin.calls == 2


def test_store_is_done_before_the_code_after_a_graph_break_runs():
    cfg = Config()
    seen = []

    def peek(c):
        seen.append(c.scale)
        torch._dynamo.graph_break()  # kiln runs peek in Python, at a graph break

    def f(a):
        cfg.scale = 7.0
        y = a * 2
        peek(cfg)
        return y + cfg.scale

    a = torch.randn(4)
    e = kiln.explain(f)(a)
    assert e.graph_count == 2 and e.break_reasons, e  # a break at peek(cfg)
    cfg.scale, seen[:] = 1.5, []
    out = kiln.compile(f)(a)
    torch.testing.assert_close(out, a * 2 + 7.0)
    assert seen == [7.0] and cfg.scale == 7.0


class Registry(dict):
    def get(self, model):
        return super().get(type(model).__name__) or {}


REGISTRY = Registry()
REGISTRY["Linear"] = {"hidden": 1}


def test_dict_subclass_method_with_super_get():
    m = torch.nn.Linear(4, 4)

    def f(a):
        flags = REGISTRY.get(m)
        return m(a) * len(flags)

    a = torch.randn(2, 4)
    with torch.no_grad():
        _one_graph(f, a)
        torch.testing.assert_close(kiln.compile(f)(a), f(a))


def test_import_inside_function_and_is_compiling():
    def f(a):
        import math
        from torch import compiler
        return a * math.pi if compiler.is_compiling() else a

    a = torch.randn(3)
    _one_graph(f, a)
    torch.testing.assert_close(kiln.compile(f)(a), a * 3.141592653589793)  # the compiled path, as torch.compile


def test_factories_inside_the_graph():
    def f(a):
        n = a.shape[-1]
        causal = torch.arange(n)[:, None] >= torch.arange(n)[None, :]
        bias = torch.full((n, n), torch.finfo(a.dtype).min) * (~causal)
        return a @ torch.ones(n, n) + bias + torch.zeros(n, dtype=a.dtype) + torch.tensor([1.0, 2.0, 3.0, 4.0])

    a = torch.randn(4, 4)
    _one_graph(f, a)
    torch.testing.assert_close(kiln.compile(f)(a), f(a))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])])
def test_tensor_to_same_device_and_dtype(device):
    def f(a, b):
        return a.to(b.device) + a.to(b) + a.to(device=b.device, dtype=torch.float64).float() + a.to(b, copy=False)

    a, b = torch.randn(5, device=device), torch.randn(5, device=device)
    _one_graph(f, a, b)
    torch.testing.assert_close(kiln.compile(f)(a, b), f(a, b))


def test_signature_of_a_module_method():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def chunk(self, x):
            return self.fc(x).relu()

        def forward(self, x):
            n = len(inspect.signature(self.chunk).parameters)
            return self.chunk(x) * n

    m = Block().eval()
    a = torch.randn(2, 4)
    with torch.no_grad():
        _one_graph(m, a)
        torch.testing.assert_close(kiln.compile(m)(a), m(a))


def test_null_contexts_change_nothing():
    import contextlib

    def f(a):
        with contextlib.nullcontext():
            b = a.sin()
        with torch.autocast("cpu", enabled=False):
            c = b * 2
        return c + 1

    a = torch.randn(4)
    _one_graph(f, a)
    torch.testing.assert_close(kiln.compile(f)(a), f(a))


def _lookup(d, k):
    return d[k]


def test_exceptions_raised_and_caught_inside_the_function_are_captured():
    # try/except around code that raises during capture: the exception goes to the handler the
    # exception table names, in the frame or in a caller, as in eager
    def f(x, d):
        try:
            v = _lookup(d, "missing")  # KeyError inside an inlined call
        except KeyError:
            v = 2.0
        try:
            raise ValueError("bad")
        except (TypeError, ValueError) as e:
            n = len(str(e))
        try:
            try:
                iter(5)
            finally:
                x = x + 1
        except TypeError:
            x = x * 2
        try:
            iter(None)
            ok = 1.0
        except TypeError:  # transformers' ModelOutput tests iterability this way
            ok = 0.0
        return x * v + n + ok

    x, d = torch.randn(3), {"a": 1.0}
    _one_graph(f, x, d)
    torch.testing.assert_close(kiln.compile(f)(x, d), f(x, d))


def test_an_exception_no_handler_takes_is_raised_as_eager_raises():
    def f(x):
        try:
            y = x * 2
        except KeyError:
            y = x
        raise ValueError(f"shape {tuple(y.shape)}")

    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        kiln.compile(f)(torch.randn(3))


def test_model_output_from_a_single_non_tensor_value():
    from transformers.modeling_outputs import BaseModelOutput

    def f(x):
        empty = BaseModelOutput(last_hidden_state=None)  # iter(None) fails: nothing is mapped
        seq = BaseModelOutput((x, x * 2))  # not (key, value) pairs: the field is mapped as it is
        return len(empty), seq[0][1] + 1, list(seq.keys())

    x = torch.randn(3)
    _one_graph(f, x)
    out, ref = kiln.compile(f)(x), f(x)
    assert out[0] == ref[0] and out[2] == ref[2]
    torch.testing.assert_close(out[1], ref[1])


def test_torch_modules_built_in_the_function_follow_their_arguments():
    # nn.Softmax(dim=d) built at every call: one graph per dim, each equal to eager
    def fn(x, d):
        return torch.nn.Softmax(dim=d)(x) * 2

    compiled = kiln.compile(fn)
    x = torch.randn(3, 4)
    for d in (0, 1, 0, -1):
        torch.testing.assert_close(compiled(x, d), fn(x, d))
    e = kiln.explain(fn)(x, 1)
    assert e.graph_count == 1 and not e.break_reasons


def test_a_module_switched_to_eval_in_the_frame_is_read_in_eval_mode():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = torch.nn.Dropout(0.5)

        def forward(self, x):
            self.drop.eval()  # its forward reads training=False, set just now
            return self.drop(x) + torch.nn.Dropout(0.9).eval()(x)

    block = Block()
    x = torch.randn(8, 8)
    torch.testing.assert_close(kiln.compile(block)(x), 2 * x)
    assert block.drop.training is False  # the store happened for the caller too


def test_a_module_with_parameters_built_around_another_runs_eagerly_with_its_reason():
    """nn.Linear(4, 2)(x) alone compiles (test_modules_built_in_function.py); a container built
    around it would have to be built again around the same fresh Linear."""
    def fn(x):
        return torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.Tanh())(x)  # new random weights at every call

    e = kiln.explain(fn)(torch.randn(3, 4))
    assert any("around other modules owns parameters" in r["reason"] for r in e.break_reasons), e.break_reasons
    torch.manual_seed(0)
    want = fn(torch.ones(3, 4))
    torch.manual_seed(0)
    torch.testing.assert_close(kiln.compile(fn)(torch.ones(3, 4)), want)


def test_a_module_built_around_a_callers_module_sees_its_changes():
    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.act = torch.nn.LeakyReLU(0.1)

        def forward(self, x):
            return torch.nn.Sequential(self.act, torch.nn.Tanh())(x)

    holder = Holder()
    compiled = kiln.compile(holder)
    x = torch.randn(4, 4)
    torch.testing.assert_close(compiled(x), holder(x))
    holder.act.negative_slope = 0.7  # read through the Sequential at the next call
    torch.testing.assert_close(compiled(x), holder(x))


def _assert_one_graph(fn, *args):
    """kiln.explain: one graph, no break."""
    e = kiln.explain(fn)(*args)
    assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons


class _Implementations(collections.abc.MutableMapping):
    """Hugging Face's GeneralInterface: a class-wide mapping and an instance's overrides."""
    _global = {"doubled": lambda self, x: (x @ self.w) * 2}

    def __init__(self):
        self._local = {}

    def __getitem__(self, key):
        return self._local[key] if key in self._local else self._global[key]

    def __setitem__(self, key, value):
        self._local[key] = value

    def __delitem__(self, key):
        del self._local[key]

    def __iter__(self):
        return iter({**self._global, **self._local})

    def __len__(self):
        return len(self._global.keys() | self._local.keys())

    def get_interface(self, name, default):
        return super().get(name, default)


_IMPLEMENTATIONS = _Implementations()


def _dispatched(interface=_IMPLEMENTATIONS):
    """HF's use_experts_implementation: the class's forward replaced by a closure that asks the
    interface it closed over for the implementation the module's config names."""
    def wrap(cls):
        original = cls.forward

        @functools.wraps(original)
        def forward(self, *args, **kwargs):
            return interface.get_interface(self.implementation, original)(self, *args, **kwargs)

        cls.forward = forward
        return cls
    return wrap


@_dispatched()
class _Experts(torch.nn.Module):
    def __init__(self, implementation):
        super().__init__()
        self.implementation = implementation
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        return x @ self.w


class _Block(torch.nn.Module):
    def __init__(self, implementation):
        super().__init__()
        self.experts = _Experts(implementation)

    def forward(self, x):
        return self.experts(x).relu()


@pytest.mark.parametrize("implementation", ["eager", "doubled", "registered later"])
def test_a_forward_dispatching_through_the_interface_it_closed_over_is_one_graph(implementation):
    """The experts' forward (inlined from its parent's) reads its closure through its source, so
    the interface's method is inlined and guarded: one graph, and an implementation registered
    after the first call is the one the next call runs."""
    block = _Block("doubled" if implementation == "registered later" else implementation).eval()
    x = torch.randn(3, 4)
    _assert_one_graph(block, x)
    compiled = kiln.compile(block)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), block(x))
        if implementation == "registered later":
            _IMPLEMENTATIONS["doubled"] = lambda self, x: (x @ self.w) * 3
            try:
                torch.testing.assert_close(compiled(x), block(x))
                torch.testing.assert_close(compiled(x), (x @ block.experts.w * 3).relu())
            finally:
                del _IMPLEMENTATIONS["doubled"]


def test_subscript_of_a_callers_mapping_follows_its_state():
    """obj[key] on an object whose class defines __getitem__ in Python runs that __getitem__
    inlined: what it reads is guarded, so a later change of the object's state is seen (called for
    real at capture, its answer was kept)."""
    table = _Implementations()

    def fn(x):
        return x * (3.0 if table.get("scale") is not None else 2.0)

    compiled = kiln.compile(fn)
    x = torch.ones(3)
    torch.testing.assert_close(compiled(x), fn(x))
    table["scale"] = 1
    torch.testing.assert_close(compiled(x), fn(x))
    del table["scale"]
    torch.testing.assert_close(compiled(x), fn(x))


class _LayerView(collections.abc.Sequence):
    """Hugging Face's _PerLayerConfigView: a Sequence whose iteration is Sequence.__iter__'s
    self[i] until IndexError."""

    def __init__(self, config):
        self._config = config

    def __len__(self):
        return self._config.layers

    def __getitem__(self, i):
        if i < 0 or i >= len(self):
            raise IndexError("list index out of range")
        return self._config


class _LayeredConfig:
    def __init__(self):
        self.layers = 3
        self.scale = 0.5

    @property
    def per_layer_config(self):
        return _LayerView(self)


_LAYERED = _LayeredConfig()


def test_iterating_a_sequence_of_a_config_copied_in_the_function():
    """Whisper's decoder deep-copies its config and builds its cache from the copy, iterating the
    copy's per-layer view (a Sequence made in the frame): Sequence.__iter__ is inlined."""
    import copy

    def fn(x):
        c = copy.deepcopy(_LAYERED)
        c.layers = 2
        for layer in c.per_layer_config:
            x = x * layer.scale + 1
        return x

    _assert_one_graph(fn, torch.randn(3))
    x = torch.randn(3)
    torch.testing.assert_close(kiln.compile(fn)(x), fn(x))


class _Router(torch.nn.Module):
    """Switch Transformers' router: `self.classifier = self.classifier.to(self.dtype)` per call."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.classifier = torch.nn.Linear(8, 4, bias=False)
        self.dtype = dtype

    def forward(self, x):
        x = x.to(self.dtype)
        self.classifier = self.classifier.to(self.dtype)
        return torch.softmax(self.classifier(x), dim=-1)


def test_module_to_where_nothing_converts_is_the_module():
    r = _Router()
    x = torch.randn(2, 8)
    _assert_one_graph(r, x)
    compiled = kiln.compile(r)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), r(x))
        # the router now converts its classifier: eager's conversion happens, guards see it
        r.dtype = torch.float64
        want = _Router(torch.float64)
        want.load_state_dict(r.state_dict())
        got = compiled(x)
        assert got.dtype == torch.float64 and r.classifier.weight.dtype == torch.float64
        torch.testing.assert_close(got, want(x))
        torch.testing.assert_close(compiled(x), want(x))


class _ClassInstantier(OrderedDict):
    """transformers.activations.ClassInstantier (ACT2FN): each lookup builds a new module."""

    def __getitem__(self, key):
        content = super().__getitem__(key)
        cls, kwargs = content if isinstance(content, tuple) else (content, {})
        return cls(**kwargs)


_ACT2FN = _ClassInstantier({"gelu": torch.nn.GELU, "leaky": (torch.nn.LeakyReLU, {"negative_slope": 0.2})})


class _Doubling(dict):
    def __getitem__(self, key):
        return super().__getitem__(key) * 2


_TABLE = _Doubling(scale=1.5)


def test_a_dict_subclass_lookup_runs_its_own_getitem_over_guarded_storage():
    """ACT2FN["gelu"](x) in a forward (DeBERTa-v2's pooler): its __getitem__ inlined, the module
    it builds a module built in the function; read for real it was a new object per call,
    guarded by identity, and every call recompiled until the cache limit."""
    lin = torch.nn.Linear(8, 8)

    def fn(x):
        try:
            missing = _TABLE["absent"]
        except KeyError:
            missing = 0.0
        return _ACT2FN["gelu"](lin(x)) + _ACT2FN["leaky"](x) * _TABLE["scale"] + missing

    compiled = kiln.compile(fn)
    before = kiln.stats()
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(4, 8)
            torch.testing.assert_close(compiled(x), fn(x))
        after = kiln.stats()
        assert after["recompiles"] == before["recompiles"] and after["eager_fallbacks"] == before["eager_fallbacks"]
        _assert_one_graph(fn, x)
        _TABLE["scale"], _TABLE["absent"] = 0.5, 2.0  # the storage changed: seen
        try:
            torch.testing.assert_close(compiled(x), fn(x))
        finally:
            _TABLE["scale"] = 1.5
            del _TABLE["absent"]
