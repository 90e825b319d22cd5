"""Guards and graph inputs read module attributes through a fast path (parameters, buffers and
submodules straight from the module's dicts, shared prefixes read once per call). These tests
change a model between calls in each way that path could miss, and compare with eager."""
import torch
import torch.nn as nn

import kiln


def _same(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.register_buffer("shift", torch.randn(6))

    def forward(self, x):
        return torch.relu(self.fc(x)) + self.shift


class Net(nn.Module):
    def __init__(self, n=3):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(n))
        self.scale = 2.0

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.blocks[-1](x) * self.scale


def _fresh(net, x):
    with torch.no_grad():
        return net(x)


def test_parameter_buffer_and_submodule_replacements_are_seen():
    net = Net().eval().requires_grad_(False)
    f = kiln.compile(net)
    x = torch.randn(4, 6)
    with torch.no_grad():
        _same(f(x), _fresh(net, x))
        net.blocks[1].fc.weight = nn.Parameter(torch.randn(6, 6), requires_grad=False)  # a new parameter object
        _same(f(x), _fresh(net, x))
        net.blocks[2].shift = torch.randn(6)  # a buffer reassigned
        _same(f(x), _fresh(net, x))
        net.blocks[0] = Block().requires_grad_(False)  # a ModuleList slot replaced
        _same(f(x), _fresh(net, x))
        net.blocks[-1].fc = nn.Linear(6, 6).requires_grad_(False)  # a submodule replaced
        _same(f(x), _fresh(net, x))
        net.scale = 3.0  # a plain attribute in the instance dict
        _same(f(x), _fresh(net, x))
        net.blocks.append(Block().requires_grad_(False))  # the list grows: the loop is longer
        _same(f(x), _fresh(net, x))


def test_in_place_parameter_update_is_seen_without_recompile():
    net = Net().eval().requires_grad_(False)
    f = kiln.compile(net)
    x = torch.randn(4, 6)
    with torch.no_grad():
        f(x)
        before = kiln.stats()["recompiles"]
        net.blocks[1].fc.weight.mul_(-1)
        _same(f(x), _fresh(net, x))
        assert kiln.stats()["recompiles"] == before


class Redirecting(nn.Module):
    """A module with a __getattr__ of its own: the fast path must leave it to Python."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(5, 5)
        self.use_alt = False
        self.alt = nn.Linear(5, 5)

    def __getattr__(self, name):
        if name == "proj":
            return self.alt if self.__dict__["use_alt"] else self.inner
        return super().__getattr__(name)

    def forward(self, x):
        return self.proj(x)


def test_module_with_its_own_getattr():
    m = Redirecting().eval().requires_grad_(False)
    f = kiln.compile(m)
    x = torch.randn(3, 5)
    with torch.no_grad():
        _same(f(x), m(x))
        m.use_alt = True
        _same(f(x), m(x))


class ShadowingProperty(nn.Module):
    """A property on the class wins over a submodule of the same name in Module's lookup."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.pick_b = False

    @property
    def chosen(self):
        return self.b if self.pick_b else self.a

    def forward(self, x):
        return self.chosen(x)


def test_property_is_read_through_python():
    m = ShadowingProperty().eval().requires_grad_(False)
    f = kiln.compile(m)
    x = torch.randn(2, 4)
    with torch.no_grad():
        _same(f(x), m(x))
        m.pick_b = True
        _same(f(x), m(x))


SCALE = 1.5


def _helper(x):
    return x * SCALE + len(_helper.__code__.co_varnames)


def test_guards_are_not_repeated_and_code_contents_are_not_guarded():
    def f(x):
        return _helper(x) + _helper(x * 2) + _helper(x + 1)

    x = torch.randn(5)
    e = kiln.explain(f)(x)
    assert len(e.guards) == len(set(e.guards)), "\n".join(e.guards)
    # The helper's code object is identity-guarded; what lies inside it cannot change.
    assert any("__code__ is" in g for g in e.guards), "\n".join(e.guards)
    assert not any("co_varnames" in g for g in e.guards), "\n".join(e.guards)
    torch.testing.assert_close(kiln.compile(f)(x), f(x))


class Optional(nn.Module):
    """Reads hasattr(self, "extra"): answered from the module's dicts without Python."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        if hasattr(self, "extra"):
            y = y + self.extra(y) if callable(self.extra) else y + self.extra
        return y


def test_hasattr_on_a_module_follows_each_of_its_dicts():
    m = Optional().eval().requires_grad_(False)
    f = kiln.compile(m)
    x = torch.randn(3, 4)
    with torch.no_grad():
        _same(f(x), m(x))
        m.extra = nn.Linear(4, 4).requires_grad_(False)  # a submodule (_modules)
        _same(f(x), m(x))
        del m.extra
        _same(f(x), m(x))
        m.register_buffer("extra", torch.randn(4))  # a buffer (_buffers)
        _same(f(x), m(x))
        del m.extra
        m.extra = nn.Parameter(torch.randn(4), requires_grad=False)  # a parameter (_parameters)
        _same(f(x), m(x))
        del m.extra
        _same(f(x), m(x))
        Optional.extra = torch.ones(4)  # on the class: the generic lookup answers
        try:
            _same(f(x), m(x))
        finally:
            del Optional.extra
        _same(f(x), m(x))


class Settings:
    def __init__(self, scale):
        self.scale = scale
        self.shift = 0.5


class Layer(nn.Module):
    def __init__(self, settings):
        super().__init__()
        self.settings = settings
        self.fc = nn.Linear(5, 5)

    def forward(self, x):
        return self.fc(x) * self.settings.scale + self.settings.shift


class Stack(nn.Module):
    def __init__(self, n=4):
        super().__init__()
        self.settings = Settings(2.0)
        self.layers = nn.ModuleList(Layer(self.settings) for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x * self.settings.scale


def test_one_settings_object_shared_by_every_layer():
    # Each layer reaches the same object: its attributes are guarded once, through the first
    # path, and every other path is guarded to reach that same object.
    m = Stack().eval().requires_grad_(False)
    x = torch.randn(3, 5)
    with torch.no_grad():
        e = kiln.explain(m)(x)
        assert e.graph_count == 1
        scale_guards = [g for g in e.guards if g.endswith(".scale == 2.0")]
        assert len(scale_guards) == 1, "\n".join(e.guards)
        assert sum("SAME_OBJECT" in g and ".settings is" in g for g in e.guards) == 4, "\n".join(e.guards)
        f = kiln.compile(m)
        _same(f(x), m(x))
        m.settings.scale = 3.0  # the shared object changes: every layer sees it
        _same(f(x), m(x))
        m.layers[2].settings = Settings(-1.0)  # one layer gets an object of its own
        _same(f(x), m(x))
        m.layers[2].settings = m.settings
        m.layers[1].settings.shift = 4.0  # through a layer's path: the shared object
        _same(f(x), m(x))


def test_a_model_with_hundreds_of_parameters_sees_a_change_deep_inside():
    torch.manual_seed(0)
    m = nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Dropout(0.5)) for _ in range(60)]).eval()
    m.requires_grad_(False)
    f = kiln.compile(m)
    x = torch.randn(2, 4)
    with torch.no_grad():
        _same(f(x), m(x))
        m[41][1].eps = 0.5  # one LayerNorm's eps
        _same(f(x), m(x))
        m[57][2].train()  # one dropout in training mode: eager's random mask, so compare shape
        assert f(x).shape == m(x).shape
        m[57][2].eval()
        handle = m[13][0].register_forward_hook(lambda mod, inp, out: out * 0)
        _same(f(x), m(x))
        handle.remove()
        m[29][0].weight.data = torch.randn(4, 4)  # same shape, a new tensor under the parameter
        _same(f(x), m(x))
        m[33][0].bias = None
        _same(f(x), m(x))


class _Holder:
    pass


_holder = _Holder()


def test_an_attribute_found_absent_by_a_caught_attributeerror_is_guarded():
    def f(x):
        try:
            scale = _holder.scale
        except AttributeError:
            scale = 3.0
        return x * scale

    cf = kiln.compile(f)
    x = torch.randn(4)
    _same(cf(x), f(x))
    _holder.scale = 2.0
    try:
        _same(cf(x), f(x))
    finally:
        del _holder.scale
    _same(cf(x), f(x))


def test_the_order_of_a_dicts_keys_is_guarded():
    def f(x, d):
        for k in d:
            x = x * k + d[k]
        return x

    cf = kiln.compile(f)
    d = {2: 4.0, 3: 5.0}
    x = torch.randn(3)
    _same(cf(x, d), f(x, d))
    d[2] = d.pop(2)  # the same items, another order
    _same(cf(x, d), f(x, d))


def test_attributes_of_a_users_module_are_guarded():
    """m.fn and m.SCALE of a module of the user's can be rebound between calls (a monkeypatch):
    guarded where read. torch's and the standard library's module attributes are taken as fixed."""
    import types

    m = types.ModuleType("kiln_test_user_module")
    m.fn, m.SCALE = torch.sin, 2

    def foo(x):
        return m.fn(x) * m.SCALE + 1

    compiled = kiln.compile(foo)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), foo(x))
    m.fn, m.SCALE = torch.cos, 3
    torch.testing.assert_close(compiled(x), foo(x))


def test_the_order_of_a_modules_buffers_and_children_is_guarded():
    """mod.buffers() follows _buffers' order: a buffer moved to the end must be seen."""
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("b1", torch.ones(1))
            self.register_buffer("b2", torch.ones(1) * 2)

    mod = M()

    def fn(x):
        for i, b in enumerate(mod.buffers()):
            x = x + b.sum() * (i + 2)
        return x

    compiled = kiln.compile(fn)
    x = torch.zeros(1)
    torch.testing.assert_close(compiled(x), fn(x))
    mod._buffers["b1"] = mod._buffers.pop("b1")
    torch.testing.assert_close(compiled(x), fn(x))


def test_torch_functions_rebound_recompile_and_other_module_globals_do_not():
    """torch.sigmoid read as a constant: rebinding it is seen; torch's own code setting another
    global of the module (torch.cuda's `_initialized` at its first use) costs no recompile."""
    import torch.nn.functional as F

    def fn(x):
        return torch.sigmoid(x) + F.gelu(x)

    compiled = kiln.compile(fn)
    kiln.reset()
    x = torch.randn(5)
    torch.testing.assert_close(compiled(x), fn(x))
    try:
        torch._kiln_test_unrelated = object()
        F._kiln_test_unrelated = object()
        torch.testing.assert_close(compiled(x), fn(x))
        assert kiln.stats()["recompiles"] == 0, kiln.stats()["recompile_reasons"]
        saved = torch.sigmoid
        torch.sigmoid = torch.tanh
        try:
            torch.testing.assert_close(compiled(x), fn(x))
        finally:
            torch.sigmoid = saved
        torch.testing.assert_close(compiled(x), fn(x))
    finally:
        del torch._kiln_test_unrelated, F._kiln_test_unrelated


def test_torch_backends_flags_read_in_the_function_are_guarded():
    def fn(x):
        return x * (2 if torch.backends.cudnn.benchmark else 3)

    compiled = kiln.compile(fn)
    x = torch.randn(3)
    before = torch.backends.cudnn.benchmark
    try:
        for flag in (False, True, False):
            torch.backends.cudnn.benchmark = flag
            torch.testing.assert_close(compiled(x), fn(x))
    finally:
        torch.backends.cudnn.benchmark = before


def _twice(func):
    def wrapper(*a, **k):
        return func(*a, **k) * 2
    return wrapper


def _plus_one(func):
    def wrapper(*a, **k):
        return func(*a, **k) + 1
    return wrapper


class _Decorated:
    @_twice
    def f(self, x):
        return x.sin()

    @_plus_one
    def g(self, x):
        return x.cos()


def test_methods_whose_wrappers_close_over_different_functions_hold_their_guards():
    """Each wrapper's `func` cell (a method found on the class of an object made in the function:
    no source of its own) is read, guarded, through that cell: two cells are two places."""

    def fn(x):
        obj = _Decorated()
        return obj.f(x) + obj.g(x)

    compiled = kiln.compile(fn)
    kiln.reset()
    for n in (3, 4, 5, 6, 7):
        x = torch.randn(n)
        torch.testing.assert_close(compiled(x), fn(x))
    assert kiln.stats()["recompiles"] <= 1, kiln.stats()["recompile_reasons"]
