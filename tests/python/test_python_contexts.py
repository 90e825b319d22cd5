"""Context managers written in Python, `global` stores, torch's deterministic-algorithms flag,
a class's own __setattr__, and convolution/pooling argument forms: captured as TorchDynamo
captures them (one graph), each equal to eager with eager's effects on Python state."""
import contextlib
import dataclasses
import types

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from _helpers import assert_same


def _graphs(fn, *args):
    e = kiln.explain(fn)(*args)
    return e.graph_count, e.graph_break_count


def _one_graph(fn, *args):
    e = kiln.explain(fn)(*args)
    assert e.graph_count == 1 and e.graph_break_count == 0, e.break_reasons


# ---- context managers written in Python --------------------------------------------------------

class Depth:
    """A caller's context manager that counts how deep its blocks nest and logs them."""

    def __init__(self, log):
        self.depth = 0
        self.log = log

    def __enter__(self):
        self.depth += 1
        self.log.append(("enter", self.depth))
        return self

    def __exit__(self, exc_type, exc, tb):
        self.log.append(("exit", self.depth))
        self.depth -= 1
        return False


@contextlib.contextmanager
def scaled(x, factor=2.0, log=None):
    if log is not None:
        log.append("before")
    try:
        yield x * factor
    finally:
        if log is not None:
            log.append("after")


@contextlib.contextmanager
def grad_off():
    prev = torch.is_grad_enabled()
    torch.set_grad_enabled(False)
    try:
        yield
    finally:
        torch.set_grad_enabled(prev)


def test_caller_context_manager_state_and_values():
    def fn(x, cm):
        with cm as c:
            y = x.sin() * c.depth
            with cm:
                y = y + c.depth
        return y + cm.depth

    eager_log, kiln_log = [], []
    x = torch.randn(5)
    ref_cm, cm = Depth(eager_log), Depth(kiln_log)
    ref = fn(x, ref_cm)
    cf = kiln.compile(fn)
    for _ in range(2):
        assert_same(cf(x, cm), ref)
    assert kiln_log == eager_log * 2 and cm.depth == ref_cm.depth == 0
    _one_graph(fn, x, Depth([]))


def test_context_manager_made_in_the_function():
    class Timer:
        def __enter__(self):
            self.entered = True
            return self

        def __exit__(self, *exc):
            self.done = True

    def fn(x):
        t = Timer()
        with t:
            y = x.cos()
        return y * 2 if t.done and t.entered else y

    x = torch.randn(4, 3)
    assert_same(kiln.compile(fn)(x), fn(x))
    _one_graph(fn, x)


def test_contextmanager_generator_yields_a_tensor_and_runs_its_finally():
    log_eager, log_kiln = [], []

    def fn(x, log):
        with scaled(x, 3.0, log) as xs:
            log.append("body")
            y = xs.exp()
        return y - x

    x = torch.randn(6)
    ref = fn(x, log_eager)
    assert_same(kiln.compile(fn)(x, log_kiln), ref)
    assert log_kiln == log_eager == ["before", "body", "after"]
    _one_graph(fn, x, [])


def test_contextmanager_that_turns_grad_off():
    def fn(x, w):
        with grad_off():
            frozen = x @ w
        return frozen, x @ w

    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 2, requires_grad=True)
    ref = fn(x, w)
    out = kiln.compile(fn)(x, w)
    assert_same(out, ref)
    assert not out[0].requires_grad and out[1].requires_grad
    assert torch.is_grad_enabled()
    out[1].sum().backward()
    gx = x.grad.clone()
    x.grad = None
    ref[1].sum().backward()
    assert_same(gx, x.grad)
    _one_graph(fn, x, w)


def test_nested_managers_in_a_loop_and_a_helper_made_manager():
    log = []

    def make(x):
        return scaled(x, 0.5)

    def fn(x):
        out = x
        for i in range(3):
            with Depth(log) as d, make(out) as half:
                out = half + d.depth + i
        return out

    x = torch.randn(4)
    assert_same(kiln.compile(fn)(x), fn(x))
    _one_graph(fn, x)


def test_graph_break_inside_a_python_manager_runs_the_call_eagerly(quiet_fallbacks):
    eager_log, kiln_log = [], []

    def fn(x, cm):
        with cm:
            n = int(x.sum().item() > 0)
            y = x + n
        return y

    x = torch.randn(5)
    ref = fn(x, Depth(eager_log))
    cm = Depth(kiln_log)
    assert_same(kiln.compile(fn)(x, cm), ref)
    assert kiln_log == eager_log and cm.depth == 0


def test_a_manager_that_suppresses_a_raise(quiet_fallbacks):
    def fn(x):
        with contextlib.suppress(ZeroDivisionError):
            x = x + 1
            1 / 0
        return x * 2

    x = torch.randn(3)
    assert_same(kiln.compile(fn)(x), fn(x))


def test_suppress_without_an_exception_is_one_graph():
    def fn(x):
        with contextlib.suppress(KeyError):
            y = x.relu()
        return y

    x = torch.randn(8)
    assert_same(kiln.compile(fn)(x), fn(x))
    _one_graph(fn, x)


@contextlib.contextmanager
def _no_yield():
    if False:
        yield


@contextlib.contextmanager
def _two_yields():
    yield 1
    yield 2


@pytest.mark.parametrize("case", ["entered_twice", "no_yield", "two_yields"])
def test_generator_manager_misuse_raises_as_eager(case, quiet_fallbacks):
    def fn(x):
        if case == "entered_twice":
            cm = scaled(x)
            with cm:
                pass
            with cm:
                pass
        elif case == "no_yield":
            with _no_yield():
                pass
        else:
            with _two_yields():
                pass
        return x + 1

    x = torch.randn(2)
    with pytest.raises((AttributeError, RuntimeError)) as eager:
        fn(x)
    with pytest.raises(type(eager.value)) as compiled:
        kiln.compile(fn)(x)
    assert str(compiled.value) == str(eager.value)


def test_torch_own_context_managers_still_run_eagerly(quiet_fallbacks):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def fn(q):
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, q, q)

    q = torch.randn(1, 2, 4, 8)
    assert_same(kiln.compile(fn)(q), fn(q), rtol=1e-5, atol=1e-6)


# ---- `global` stores ------------------------------------------------------------------------

COUNT = 0
CACHE = None


def _bump(x):
    global COUNT
    COUNT += 1
    return x * COUNT


def _cache(x):
    global CACHE
    CACHE = x * 2
    return CACHE + 1


def test_global_store_is_replayed_and_read_back():
    global COUNT
    COUNT = 0
    cf = kiln.compile(_bump)
    x = torch.randn(3)
    outs = [cf(x) for _ in range(3)]
    assert COUNT == 3
    for i, o in enumerate(outs, 1):
        assert_same(o, x * i)
    COUNT = 0
    _one_graph(_bump, x)


def test_global_tensor_cache():
    global CACHE
    CACHE = None
    x = torch.randn(4)
    out = kiln.compile(_cache)(x)
    assert_same(out, x * 2 + 1)
    assert_same(CACHE, x * 2)
    CACHE = None
    _one_graph(_cache, x)


def test_global_store_before_a_graph_break_is_done_before_it():
    global COUNT
    COUNT = 0
    seen = []

    def fn(x):
        global COUNT
        COUNT = 7
        seen.append(COUNT)
        n = x.sum().item()
        return x + COUNT + n

    x = torch.randn(3)
    assert_same(kiln.compile(fn)(x), x + 7 + x.sum().item())
    assert COUNT == 7 and seen == [7]


def test_global_store_and_delete_in_another_module():
    mod = types.ModuleType("kiln_test_globals_mod")
    exec(
        "def fn(x):\n"
        "    global TMP, KEPT\n"
        "    TMP = x + 1\n"
        "    KEPT = TMP * 2\n"
        "    del TMP\n"
        "    return KEPT\n",
        mod.__dict__,
    )

    def caller(x):
        return mod.fn(x) - 1

    x = torch.randn(3)
    assert_same(kiln.compile(caller)(x), (x + 1) * 2 - 1)
    assert "TMP" not in mod.__dict__
    assert_same(mod.KEPT, (x + 1) * 2)
    _one_graph(caller, x)


# ---- `nonlocal` stores ---------------------------------------------------------------------

def _counter():
    count = 0
    cache = None

    def fn(x):
        nonlocal count, cache
        count += 1
        cache = x * 2
        return x + count

    return fn, lambda: (count, cache)


def test_nonlocal_store_of_the_compiled_function_is_replayed():
    fn, state = _counter()
    compiled = kiln.compile(fn)
    x = torch.randn(3)
    for i in range(1, 4):
        assert_same(compiled(x), x + i)
        count, cache = state()
        assert count == i
        assert_same(cache, x * 2)
    _one_graph(_counter()[0], x)


def test_nonlocal_store_in_an_inlined_helper():
    def fn(x):
        total = torch.zeros(3)
        calls = []

        def add(v):
            nonlocal total
            total = total + v
            calls.append(1)

        add(x)
        add(x * 2)
        return total, len(calls)

    x = torch.randn(3)
    assert_same(kiln.compile(fn)(x), fn(x))
    _one_graph(fn, x)


# ---- torch's deterministic-algorithms flag ---------------------------------------------------

def test_deterministic_algorithms_flag_is_guarded():
    def fn(x):
        if torch.are_deterministic_algorithms_enabled():
            return x + 1
        return x - 1

    cf = kiln.compile(fn)
    x = torch.randn(3)
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(False)
        assert_same(cf(x), x - 1)
        torch.use_deterministic_algorithms(True)
        assert_same(cf(x), x + 1)
        torch.use_deterministic_algorithms(False)
        assert_same(cf(x), x - 1)
    finally:
        torch.use_deterministic_algorithms(before)
    _one_graph(fn, x)


# ---- a class's own __setattr__ -----------------------------------------------------------------

class MappedConfig:
    """transformers' PretrainedConfig protocol: attribute names mapped in __setattr__."""

    attribute_map = {"hidden_size": "n_embd"}

    def __init__(self):
        self.n_embd = 4
        self.calls = 0

    def __setattr__(self, key, value):
        if key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        super().__setattr__(key, value)

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


def test_class_setattr_in_python_is_inlined():
    def fn(x, cfg):
        cfg.hidden_size = 3
        cfg.calls = cfg.calls + 1
        return x * cfg.n_embd + cfg.calls

    x = torch.randn(3)
    ref_cfg, cfg = MappedConfig(), MappedConfig()
    ref = fn(x, ref_cfg)
    assert_same(kiln.compile(fn)(x, cfg), ref)
    assert cfg.n_embd == ref_cfg.n_embd == 3 and cfg.calls == ref_cfg.calls == 1
    assert "hidden_size" not in vars(cfg)


def test_object_setattr_on_a_frozen_dataclass_of_the_caller():
    @dataclasses.dataclass(frozen=True)
    class Frozen:
        scale: float

    def fn(x, f):
        object.__setattr__(f, "scale", 5.0)
        return x * f.scale

    x = torch.randn(3)
    f = Frozen(2.0)
    assert_same(kiln.compile(fn)(x, f), x * 5.0)
    assert f.scale == 5.0


def test_transformers_config_attribute_map():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_embd=8, n_layer=1, n_head=2)

    def fn(x):
        cfg.hidden_size = 16
        return x * cfg.n_embd

    x = torch.randn(3)
    assert_same(kiln.compile(fn)(x), x * 16)
    assert cfg.n_embd == 16
    cfg.n_embd = 8
    _one_graph(fn, x)
    assert cfg.n_embd == 16


# ---- convolution and pooling argument forms ---------------------------------------------------

@pytest.mark.parametrize("form", ["unbatched_module", "unbatched_functional", "valid", "same", "same_module"])
def test_conv2d_argument_forms(form):
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, padding="same" if form == "same_module" else 0)

    def fn(x, w):
        if form.startswith("unbatched_module") or form == "same_module":
            return conv(x).relu()
        if form == "unbatched_functional":
            return F.conv2d(x, w, stride=2).relu()
        return F.conv2d(x, w, padding=form).relu()

    x = torch.randn(3, 9, 9) if form.startswith("unbatched") else torch.randn(2, 3, 9, 9)
    x.requires_grad_()
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    ref = fn(x, w)
    out = kiln.compile(fn)(x, w)
    assert_same(out, ref, rtol=1e-5, atol=1e-5)
    gx, gw = torch.autograd.grad(ref.sum(), (x, w), allow_unused=True)
    kx, kw = torch.autograd.grad(out.sum(), (x, w), allow_unused=True)
    assert_same(kx, gx, rtol=1e-5, atol=1e-5)
    if gw is not None:
        assert_same(kw, gw, rtol=1e-5, atol=1e-5)
    _one_graph(fn, x.detach(), w.detach())


def test_max_pool_with_indices():
    pool = nn.MaxPool2d(2, return_indices=True)
    unpool = nn.MaxUnpool2d(2)

    def fn(x):
        y, idx = pool(x.relu())
        return unpool(y, idx), y + idx.float(), F.max_pool2d(x, 3, return_indices=True)[1]

    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    ref = fn(x)
    out = kiln.compile(fn)(x)
    assert_same(out, ref)
    (g,) = torch.autograd.grad(out[0].sum(), x)
    (gr,) = torch.autograd.grad(ref[0].sum(), x)
    assert_same(g, gr)
    _one_graph(fn, x.detach())


# ---- eager backend: batch norm in training --------------------------------------------------

@pytest.mark.parametrize("backend", ["inductor", "eager", "aot_eager"])
def test_batch_norm_training_updates_running_statistics_once(backend):
    import copy

    bn = nn.BatchNorm2d(4).train()
    ref = copy.deepcopy(bn)
    x = torch.randn(3, 4, 5, 5, requires_grad=True)
    y, yr = kiln.compile(bn, backend=backend)(x), ref(x)
    assert_same(y, yr, rtol=1e-5, atol=1e-5)
    assert_same(bn.running_mean, ref.running_mean, rtol=1e-6, atol=1e-6)
    assert_same(bn.running_var, ref.running_var, rtol=1e-6, atol=1e-6)
    (g,) = torch.autograd.grad(y.sum() + (y * y).mean(), x)
    (gr,) = torch.autograd.grad(yr.sum() + (yr * yr).mean(), x)
    assert_same(g, gr, rtol=1e-4, atol=1e-5)
