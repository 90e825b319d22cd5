"""Objects of plain user classes made inside compiled code (a KV cache built in forward, a small
helper object): __init__ and super().__init__ inlined on a tracker, attributes, methods,
properties, class attributes, the container protocol, and the object built for real only
where the program hands it out, with the attributes the program gave it."""
import abc

import pytest
import torch

import kiln


def _one_graph(fn, *args, **kwargs):
    e = kiln.explain(fn)(*args, **kwargs)
    assert e.graph_count == 1 and not e.break_reasons, e
    return e


class Affine:
    bias = 0.5  # a class attribute

    def __init__(self, scale, shift=None):
        self.scale = scale
        self.shift = shift if shift is not None else torch.zeros(())

    def __call__(self, x):
        return x * self.scale + self.shift + self.bias

    def then(self, other):
        return Affine(self.scale * other.scale, self.shift * other.scale + other.shift)


def test_object_built_used_and_returned():
    def f(x, w):
        a = Affine(w.sigmoid(), w.cos())
        b = a.then(Affine(2.0))
        return b(x), b

    x, w = torch.randn(4, 3), torch.randn(3)
    _one_graph(f, x, w)
    (y, obj), (ry, robj) = kiln.compile(f)(x, w), f(x, w)
    torch.testing.assert_close(y, ry)
    assert type(obj) is Affine and set(vars(obj)) == set(vars(robj)) == {"scale", "shift"}
    torch.testing.assert_close(obj.scale, robj.scale)
    torch.testing.assert_close(obj.shift, robj.shift)


class Base:
    def __init__(self, dim):
        self.dim = dim
        self.calls = 0

    def reduce(self, x):
        self.calls += 1
        return x.sum(self.dim)


class Child(Base):
    def __init__(self, dim, eps):
        super().__init__(dim)
        self.eps = eps

    def reduce(self, x):
        return super().reduce(x) + self.eps


class Plain:
    def __init__(self):
        super().__init__()  # object.__init__
        self.tag = "plain"


def test_super_init_and_super_method_calls():
    def f(x):
        c = Child(-1, 0.25)
        y = c.reduce(x) * c.reduce(x.cos())
        return y + c.calls, c, Plain().tag

    x = torch.randn(3, 5)
    _one_graph(f, x)
    (y, c, tag), (ry, rc, rtag) = kiln.compile(f)(x), f(x)
    torch.testing.assert_close(y, ry)
    assert type(c) is Child and vars(c) == vars(rc) and tag == rtag


class Window:
    def __init__(self, t):
        self._t = t
        self.history = []

    @property
    def t(self):
        return self._t

    @t.setter
    def t(self, v):
        self.history.append(v.shape[-1])
        self._t = v

    @staticmethod
    def pad(x):
        return torch.nn.functional.pad(x, (1, 1))

    @classmethod
    def of(cls, x):
        return cls(x * 2)

    def __len__(self):
        return self._t.shape[-1]

    def __getitem__(self, i):
        return self._t[..., i]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]


def test_properties_static_and_class_methods_and_container_protocol():
    def f(x):
        w = Window.of(x)
        w.t = Window.pad(w.t)
        total = sum(w) if w else x.sum(-1)
        return total + w[0] + len(w), w.history, w

    x = torch.randn(2, 4)
    _one_graph(f, x)
    (y, hist, w), (ry, rhist, rw) = kiln.compile(f)(x), f(x)
    torch.testing.assert_close(y, ry)
    assert hist == rhist == [6]
    assert type(w) is Window and len(w) == len(rw)
    torch.testing.assert_close(w.t, rw.t)


class Lazy:
    def __init__(self):
        self.ready = False

    def __getattr__(self, name):
        return 3.0 if name == "fallback" else None


def test_isinstance_type_hasattr_getattr_and___getattr__():
    def f(x):
        o = Lazy()
        k = 1.0 if isinstance(o, Lazy) and type(o) is Lazy and not o.ready else 0.0
        k += 2.0 if hasattr(o, "ready") and getattr(o, "ready", True) is False else 0.0
        return x * k + o.fallback + (0.0 if o.missing is None else 1.0)

    x = torch.randn(3)
    _one_graph(f, x)
    torch.testing.assert_close(kiln.compile(f)(x), f(x))


class Layer:
    def __init__(self):
        self.keys = None

    def update(self, k):
        self.keys = k if self.keys is None else torch.cat([self.keys, k], dim=-2)
        return self.keys

    def length(self):
        return 0 if self.keys is None else self.keys.shape[-2]


class Cache:
    """A KV cache as transformers writes one: layers made lazily as update() reaches them."""

    def __init__(self, layer_cls=Layer):
        self.layers = []
        self.layer_cls = layer_cls

    def update(self, k, idx):
        while len(self.layers) <= idx:
            self.layers.append(self.layer_cls())
        return self.layers[idx].update(k)

    def get_seq_length(self, idx=0):
        return self.layers[idx].length() if idx < len(self.layers) else 0


def _decoder(x, cache=None):
    cache = Cache() if cache is None else cache
    start = cache.get_seq_length()
    h = x
    for i in range(2):
        k = cache.update(h * (i + 1), i)
        h = h + torch.softmax(h @ k.transpose(-1, -2), -1) @ k
    return h, cache, start


def test_a_kv_cache_made_inside_the_function_is_captured_and_handed_out():
    x = torch.randn(2, 5, 8)
    _one_graph(_decoder, x)
    compiled = kiln.compile(_decoder)
    (h, cache, start), (rh, rcache, rstart) = compiled(x), _decoder(x)
    torch.testing.assert_close(h, rh)
    assert start == rstart == 0 and type(cache) is Cache and len(cache.layers) == 2
    assert all(type(layer) is Layer for layer in cache.layers)
    for a, b in zip(cache.layers, rcache.layers):
        torch.testing.assert_close(a.keys, b.keys)
    # the cache handed out is a real one: the next step continues it, compiled and eagerly alike
    step = torch.randn(2, 1, 8)
    (h2, cache2, start2), (rh2, _, rstart2) = compiled(step, cache), _decoder(step, rcache)
    assert cache2 is cache and start2 == rstart2 == 5
    torch.testing.assert_close(h2, rh2)
    torch.testing.assert_close(cache.layers[1].keys, rcache.layers[1].keys)


def test_one_object_handed_out_twice_is_one_object():
    def f(x):
        a = Affine(x.sum())
        return [a, a], {"same": a}

    x = torch.randn(3)
    _one_graph(f, x)
    (pair, d) = kiln.compile(f)(x)
    assert pair[0] is pair[1] is d["same"]
    torch.testing.assert_close(pair[0].scale, x.sum())


def test_an_object_lives_across_a_graph_break():
    def f(x):
        c = Child(0, 1.0)
        y = c.reduce(x)
        print("", end="")  # a graph break: the object is built for real here, then resumed with
        return c.reduce(y.unsqueeze(0)) + c.calls

    x = torch.randn(4, 3)
    e = kiln.explain(f)(x)
    assert e.graph_count == 2, e
    torch.testing.assert_close(kiln.compile(f)(x), f(x))


class Slotted:
    __slots__ = ("v",)

    def __init__(self, v):
        self.v = v


class WithNew:
    def __new__(cls, v):
        obj = super().__new__(cls)
        obj.made_by_new = True
        return obj

    def __init__(self, v):
        self.v = v


class Abstract(abc.ABC):
    @abc.abstractmethod
    def run(self):
        ...


@pytest.mark.parametrize("cls", [WithNew])
def test_classes_kiln_does_not_model_run_in_python_with_a_reason(cls):
    def f(x):
        o = cls(x.sin())
        return o.v * 2

    x = torch.randn(3)
    e = kiln.explain(f)(x)
    assert e.break_reasons and "call to" in str(e.break_reasons[0]), e
    torch.testing.assert_close(kiln.compile(f)(x), f(x))


def test_instantiating_an_abstract_class_raises_like_eager():
    def f(x):
        Abstract()
        return x

    with pytest.raises(TypeError) as eager:
        f(torch.randn(2))
    with pytest.raises(TypeError) as ours:
        kiln.compile(f)(torch.randn(2))
    assert str(ours.value) == str(eager.value)


def test_missing_attribute_raises_attribute_error_like_eager():
    def f(x):
        o = Affine(x)
        return o.nope

    with pytest.raises(AttributeError):
        f(torch.randn(2))
    with pytest.warns(UserWarning), pytest.raises(AttributeError):
        kiln.compile(f)(torch.randn(2))


class Settings:
    def __init__(self):
        self.scale = 2.0
        self.extra = {"shift": 1.0}

    def renamed(self, prefix):
        return {prefix + k: v for k, v in vars(self).items() if not isinstance(v, dict)}


SETTINGS = Settings()


def test_a_deep_copy_of_a_callers_object_is_the_captures_own():
    # transformers copies a config and edits the copy (copy.deepcopy, setattr, delattr): the
    # copy is made at capture time and edited for real; the caller's object is left unchanged
    import copy

    def f(x):
        c = copy.deepcopy(SETTINGS)
        c.scale = c.scale * 3
        for k, v in c.renamed("dec_").items():
            setattr(c, k, v)
        delattr(c, "extra")
        return x * c.dec_scale + (0.0 if hasattr(c, "extra") else 1.0)

    x = torch.randn(4)
    _one_graph(f, x)
    torch.testing.assert_close(kiln.compile(f)(x), f(x))
    assert SETTINGS.scale == 2.0 and "extra" in vars(SETTINGS)


# ---- nn.Module subclasses made in the function ----


class Counter(torch.nn.Module):
    def __init__(self, k):
        super().__init__()
        self.k = k
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * self.k


def test_a_user_module_made_and_called_is_one_graph_with_fresh_state_each_call():
    def f(x):
        m = Counter(2.0)
        return m(x) + m(x), m.calls

    x = torch.randn(5)
    _one_graph(f, x)
    cf = kiln.compile(f)
    for _ in range(3):
        got, want = cf(x), f(x)
        assert got[1] == want[1] == 2
        torch.testing.assert_close(got[0], want[0])


def test_a_user_module_live_at_a_graph_break_or_handed_out_is_made_each_call():
    # The object capture made is capture's own: where the program lets it go (a graph break, a
    # return, a caller's object) eager's fresh object per call is kept.
    class Holder:
        pass

    hold = Holder()

    def across_break(x):
        m = Counter(2.0)
        y = m(x)
        print("", end="")  # a graph break with m live
        return m(y), m.calls

    def returned(x):
        m = Counter(3.0)
        return m(x), m

    def stored(x):
        hold.m = Counter(4.0)
        return hold.m(x)

    x = torch.randn(5)
    for fn in (across_break, returned):
        cf = kiln.compile(fn)
        outs = [cf(x) for _ in range(3)]
        for got in outs:
            want = fn(x)
            torch.testing.assert_close(got[0], want[0])
            assert (got[1] == want[1]) if isinstance(want[1], int) else (got[1].calls == want[1].calls == 1)
        if fn is returned:
            assert outs[0][1] is not outs[1][1]
    cf = kiln.compile(stored)
    cf(x)
    first = hold.m
    torch.testing.assert_close(cf(x), stored(x))
    cf(x)
    assert hold.m is not first and hold.m.calls == 1


class _GuardedConfig:
    """A config whose class overrides __getattribute__ and reads through object's own lookup,
    as Hugging Face's PreTrainedConfig does (its heterogeneity check)."""

    def __init__(self, scale):
        self.scale = scale
        self.frozen = ("offset",)

    def __getattribute__(self, key):
        if key in super().__getattribute__("__dict__").get("frozen", ()):
            raise AttributeError(key)
        return super().__getattribute__(key)

    def scaled(self, x):
        return x * self.__getattribute__("scale")


def test_object_getattribute_past_a_class_override_is_captured():
    def direct(x, cfg):
        return x * object.__getattribute__(cfg, "scale") + 1

    def through_the_override(x, cfg):
        return cfg.scaled(x) + type(cfg).__getattribute__(cfg, "scale")

    x = torch.randn(3, 4)
    for fn in (direct, through_the_override):
        cfg = _GuardedConfig(2.0)
        _one_graph(fn, x, cfg)
        f = kiln.compile(fn)
        torch.testing.assert_close(f(x, cfg), fn(x, cfg))
        cfg.scale = 3.0  # the value read is guarded: a change is seen
        torch.testing.assert_close(f(x, cfg), fn(x, cfg))


def test_object_getattribute_of_a_missing_attribute_raises_as_eager():
    def f(x, cfg):
        return x * type(cfg).__getattribute__(cfg, "offset")

    cfg = _GuardedConfig(2.0)
    with pytest.raises(AttributeError):
        f(torch.ones(2), cfg)
    with pytest.raises(AttributeError):
        kiln.compile(f)(torch.ones(2), cfg)


def _same_as_eager(f, *args):
    """One graph, no break; result and raised errors as eager's on two fresh draws."""
    _one_graph(f, *args)
    cf = kiln.compile(f)
    for _ in range(2):
        args = tuple(torch.randn_like(a) if isinstance(a, torch.Tensor) else a for a in args)
        want, got = f(*args), cf(*args)
        assert type(got) is type(want)
        yield want, got


def test_slots_objects_are_captured_and_handed_out_with_their_slots():
    class Pair:
        __slots__ = ("a", "b")

        def __init__(self, a):
            self.a = a

        def total(self):
            return self.a + (self.b if hasattr(self, "b") else 0)

    def f(x):
        p = Pair(x.sin())
        first = p.total()
        missing = not hasattr(p, "b")
        try:
            p.b
        except AttributeError:
            missing = missing and True
        p.b = x.cos()
        return p, first + p.total(), missing

    for (pw, tw, mw), (pg, tg, mg) in _same_as_eager(f, torch.randn(5)):
        assert type(pg) is Pair and not hasattr(pg, "__dict__") and mg == mw
        torch.testing.assert_close((pg.a, pg.b, tg), (pw.a, pw.b, tw))


def test_a_frozen_dataclass_made_in_the_function_is_captured_and_stays_frozen():
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Spec:
        weight: torch.Tensor
        scale: float = 2.0

        def __post_init__(self):
            object.__setattr__(self, "weight", self.weight * self.scale)

    def f(x):
        s = Spec(x)
        try:
            s.scale = 3.0
            raised = None
        except dataclasses.FrozenInstanceError as e:
            raised = str(e)
        return s, s.weight + 1, raised

    for (sw, yw, rw), (sg, yg, rg) in _same_as_eager(f, torch.randn(4)):
        assert rg == rw and sg.scale == sw.scale
        torch.testing.assert_close((sg.weight, yg), (sw.weight, yw))
        with pytest.raises(dataclasses.FrozenInstanceError):
            sg.scale = 1.0


def test_a_class_with_its_own_setattr_and_delattr_in_python_runs_them():
    class Logged:
        def __init__(self, x):
            self.seen = []
            self.x = x

        def __setattr__(self, name, value):
            if name != "seen":
                self.seen.append(name)
                value = value * 2 if isinstance(value, torch.Tensor) else value
            super().__setattr__(name, value)

        def __delattr__(self, name):
            self.seen.append("-" + name)
            object.__delattr__(self, name)

    def f(x):
        o = Logged(x)
        o.y = x + 1
        del o.x
        return o.y, list(o.seen), hasattr(o, "x"), o

    for (yw, sw, hw, ow), (yg, sg, hg, og) in _same_as_eager(f, torch.randn(3)):
        assert (sg, hg, og.seen) == (sw, hw, ow.seen)
        torch.testing.assert_close((yg, og.y), (yw, ow.y))


def test_torch_pytree_helpers_are_one_graph():
    import torch.utils._pytree as pytree

    def f(x):
        tree = {"a": x, "b": [x * 2, (x + 1, 3)]}
        doubled = pytree.tree_map(lambda t: t * 2 if isinstance(t, torch.Tensor) else t, tree)
        leaves, spec = pytree.tree_flatten(doubled)
        rebuilt = pytree.tree_unflatten([v + 1 if isinstance(v, torch.Tensor) else v for v in leaves], spec)
        return rebuilt, len(leaves), spec.num_leaves

    e = torch._dynamo.explain(f)(torch.randn(3))
    assert e.graph_count == 1 and e.graph_break_count == 0
    for (rw, nw, kw), (rg, ng, kg) in _same_as_eager(f, torch.randn(3)):
        assert (ng, kg) == (nw, kw)
        assert pytree.tree_structure(rg) == pytree.tree_structure(rw)
        torch.testing.assert_close(pytree.tree_leaves(rg), pytree.tree_leaves(rw))
