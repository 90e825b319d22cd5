"""Tests of kiln's Python API surface: kiln.compile (all call forms and keywords), compiled
nn.Modules, kiln.explain and its ExplainOutput, kiln.stats.

Every numerical check compares a compiled call with the eager call on fresh random inputs.
Tests that run code which currently crashes the interpreter (segfault) run that code in a child
process so that the rest of the suite keeps going.
"""
from __future__ import annotations

import json
import os

import pytest
import torch
from torch import nn

import kiln

from _process import child_result, counters, delta, run_child as _run_child


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def _fresh_kiln():
    """Each test starts with empty in-memory caches and zeroed counters."""
    kiln.reset()
    yield
    kiln.reset()


def run_child(code: str, tmp_path, extra_env: dict | None = None, timeout: int = 300):
    """Runs `code` in a fresh interpreter with kiln importable and its own cache directory."""
    return _run_child(code, tmp_path / "kiln-cache", extra_env, timeout)


# The seeds' functions.

def sin_cos(x):
    return torch.sin(x) + torch.cos(x)


def gelu(x):
    return x * 0.5 * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))


def softmax_last(x):
    return torch.softmax(x, dim=-1)


def attention(q, k, v):
    scores = torch.matmul(q, k.transpose(-2, -1)) / (q.size(-1) ** 0.5)
    weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights, v)


# --------------------------------------------------------------------------------------------
# kiln.compile: call forms and keywords
# --------------------------------------------------------------------------------------------

def test_compile_plain_call_form():
    def f(x):
        return torch.sin(x) * 2.0 + 1.0

    cf = kiln.compile(f)
    x = torch.randn(6, 7)
    before = counters()
    torch.testing.assert_close(cf(x), f(x))
    d = delta(before, counters())
    assert d["graphs_compiled"] == 1
    assert d["eager_fallbacks"] == 0


def test_compile_bare_decorator_form():
    @kiln.compile
    def f(x):
        return torch.cos(x) - x

    x = torch.randn(5, 3)
    before = counters()
    torch.testing.assert_close(f(x), torch.cos(x) - x)
    assert delta(before, counters())["graphs_compiled"] == 1


def test_compile_decorator_with_keywords_form():
    @kiln.compile(mode="max-autotune")
    def f(x):
        return torch.exp(x) * x

    x = torch.randn(4, 9)
    before = counters()
    torch.testing.assert_close(f(x), torch.exp(x) * x)
    assert delta(before, counters())["graphs_compiled"] == 1


def test_compile_decorator_with_empty_parentheses():
    @kiln.compile()
    def f(x):
        return torch.abs(x) + 3

    x = torch.randn(8)
    torch.testing.assert_close(f(x), torch.abs(x) + 3)
    assert counters()["graphs_compiled"] == 1


def test_compile_none_returns_decorator():
    deco = kiln.compile(None, mode="reduce-overhead")
    assert callable(deco)
    f = deco(lambda x: x * x)
    x = torch.randn(3, 3)
    torch.testing.assert_close(f(x), x * x)


@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune",
                                  "max-autotune-no-cudagraphs", None])
def test_compile_accepts_modes(mode):
    def f(x):
        return torch.sigmoid(x) * x

    cf = kiln.compile(f, mode=mode)
    x = torch.randn(10, 4)
    torch.testing.assert_close(cf(x), f(x))


def test_compile_accepts_every_mode_torch_accepts():
    import torch._inductor
    for mode in torch._inductor.list_mode_options():
        torch.compile(lambda x: x, mode=mode)  # accepted by torch
        cf = kiln.compile(lambda x: x + 1, mode=mode)
        x = torch.randn(3)
        torch.testing.assert_close(cf(x), x + 1)


@pytest.mark.parametrize("mode", ["bad", "fastest", "DEFAULT"])
def test_compile_rejects_bad_mode(mode):
    with pytest.raises(RuntimeError) as torch_err:
        torch.compile(lambda x: x, mode=mode)
    with pytest.raises(RuntimeError, match="mode") as kiln_err:
        kiln.compile(lambda x: x, mode=mode)
    assert f"mode={mode}" in str(kiln_err.value)
    assert f"mode={mode}" in str(torch_err.value)


def test_compile_rejects_unknown_backend():
    with pytest.raises(Exception):
        kiln.compile(lambda x: x, backend="no-such-backend")


def test_compile_rejects_non_dict_options():
    with pytest.raises(TypeError):
        kiln.compile(lambda x: x, options=[("cache_limit", 2)])


@pytest.mark.parametrize("obj", [5, "not a function", 3.5, [1, 2]])
def test_compile_non_callable_raises(obj):
    with pytest.raises((RuntimeError, AssertionError), match="callable"):
        kiln.compile(obj)


def test_compile_non_callable_raises_same_type_as_torch():
    with pytest.raises(Exception) as torch_err:
        torch.compile(5)
    with pytest.raises(Exception) as kiln_err:
        kiln.compile(5)
    assert type(kiln_err.value) is type(torch_err.value)


def test_disable_runs_eagerly_and_leaves_stats_unchanged():
    def f(x):
        return torch.tanh(x) + x * 2

    cf = kiln.compile(f, disable=True)
    x = torch.randn(7, 5)
    before = kiln.stats()
    out = cf(x)
    after = kiln.stats()
    assert torch.equal(out, f(x))  # eager: bit-identical
    assert after == before


def test_disable_decorator_form():
    @kiln.compile(disable=True)
    def f(x, y):
        return x @ y

    a, b = torch.randn(3, 4), torch.randn(4, 2)
    before = counters()
    assert torch.equal(f(a, b), a @ b)
    assert counters() == before


def test_compile_bound_method_is_captured():
    class Holder:
        def __init__(self):
            self.offset = 1.0

        def method(self, x):
            return torch.sin(x) + self.offset

    h = Holder()
    cf = kiln.compile(h.method)
    x = torch.randn(4, 4)
    torch.testing.assert_close(cf(x), h.method(x))
    s = kiln.stats()
    assert s["graphs_compiled"] >= 1 or (s["eager_fallbacks"] >= 1 and s["fallback_reasons"])
    e = kiln.explain(h.method)(x)
    assert e.graph_count == 1
    h.offset = 5.0  # an attribute of the receiver is not baked in
    torch.testing.assert_close(cf(x), h.method(x))


# --------------------------------------------------------------------------------------------
# the seeds' functions: one fused kernel each, same numbers as eager
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn,shape", [(sin_cos, (16, 33)), (gelu, (8, 64)), (softmax_last, (12, 37)),
                                      (softmax_last, (2, 3, 5, 17))],
                         ids=["sin_cos", "gelu", "softmax", "softmax_4d"])
def test_seed_function_fuses_into_one_kernel(fn, shape):
    x = torch.randn(*shape)
    e = kiln.explain(fn)(x)
    assert e.graph_count == 1
    assert e.break_reasons == []
    assert len(e.kernels) == 1, [k.name for k in e.kernels]
    torch.testing.assert_close(kiln.compile(fn)(x), fn(x))


@pytest.mark.parametrize("fn", [sin_cos, gelu, softmax_last], ids=["sin_cos", "gelu", "softmax"])
def test_seed_function_float64(fn):
    x = torch.randn(9, 31, dtype=torch.float64)
    out = kiln.compile(fn)(x)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, fn(x))


def test_softmax_large_values_are_stable():
    x = torch.randn(4, 50) * 100.0
    out = kiln.compile(softmax_last)(x)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, softmax_last(x))


def test_seed_attention_matches_eager():
    q, k, v = (torch.randn(2, 3, 16, 8) for _ in range(3))
    out = kiln.compile(attention)(q, k, v)
    assert out.shape == (2, 3, 16, 8)
    torch.testing.assert_close(out, attention(q, k, v))
    c = counters()
    assert c["graphs_compiled"] == 1 and c["eager_fallbacks"] == 0
    # fresh inputs of the same shape reuse the compiled code
    q, k, v = (torch.randn(2, 3, 16, 8) for _ in range(3))
    torch.testing.assert_close(kiln.compile(attention)(q, k, v), attention(q, k, v))


def test_seed_attention_explain_captures_one_graph():
    # explain compiles but does not run the kernels, so this is safe in-process.
    q, k, v = (torch.randn(2, 3, 16, 8) for _ in range(3))
    e = kiln.explain(attention)(q, k, v)
    assert e.graph_count == 1
    assert e.break_reasons == []
    # torch's fused attention, and at most a copy into eager's row-major result (none where
    # torch's CPU kernel gives the query's layout, as torch 2.14's does)
    assert "scaled_dot_product_attention" in "".join(e.graphs)
    assert len(e.kernels) <= 1, [k.name for k in e.kernels]


# --------------------------------------------------------------------------------------------
# nn.Module
# --------------------------------------------------------------------------------------------

class MLP(nn.Module):
    def __init__(self, d_in=8, d_hidden=16, d_out=4):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class LinearReluScale(nn.Module):
    """Linear -> ReLU -> * scale + 1: an extern op followed by one fused kernel."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.scale = nn.Parameter(torch.randn(16))

    def forward(self, x):
        return torch.relu(self.fc1(x)) * self.scale + 1.0


@pytest.mark.parametrize("kind", ["custom", "sequential"])
def test_mlp_matches_eager_and_follows_parameters(kind):
    if kind == "custom":
        m = MLP(8, 16, 4)
        fc1, fc2 = m.fc1, m.fc2
    else:
        m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        fc1, fc2 = m[0], m[2]
    cm = kiln.compile(m)
    assert isinstance(cm, kiln.CompiledModule)
    with torch.no_grad():
        x = torch.randn(5, 8)
        torch.testing.assert_close(cm(x), m(x))
        before = cm(x).clone()
        fc1.weight.add_(1.0)
        after = cm(x)
        torch.testing.assert_close(after, m(x))
        assert not torch.allclose(after, before)  # the change is visible: params not baked in
        fc2.bias.mul_(-3.0)
        x2 = torch.randn(5, 8)
        torch.testing.assert_close(cm(x2), m(x2))
    c = counters()
    assert c["graphs_compiled"] == 1, kiln.stats()
    assert c["eager_fallbacks"] == 0, kiln.stats()["fallback_reasons"]


def test_fused_kernel_output_feeding_matmul_does_not_crash(tmp_path):
    """A fused kernel whose output feeds an extern matmul once segfaulted (kernel0_copy into
    the temp buffer ahead of aten::mm/bmm/addmm). Checked in a child process so that a
    regression shows up as one failure rather than a crash of the whole run."""
    code = """
        import json, torch, kiln
        cases = [
            (lambda x, w: torch.relu(x) @ w, (5, 8), (8, 16)),
            (lambda x, w: torch.matmul(x, w), (6, 16, 8), (6, 8, 16)),
            (lambda x, w: torch.matmul(torch.softmax(x, dim=-1), w), (16, 16), (16, 8)),
            (lambda x, w: torch.relu(x @ w) @ w.t(), (5, 8), (8, 16)),
        ]
        for f, sx, sw in cases:
            x, w = torch.randn(*sx), torch.randn(*sw)
            torch.testing.assert_close(kiln.compile(f)(x, w), f(x, w))
        print(json.dumps({"ok": True}))
    """
    assert child_result(run_child(code, tmp_path))["ok"]


def test_sequential_mlp_is_actually_compiled():
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    with torch.no_grad():
        e = kiln.explain(kiln.compile(m))(torch.randn(5, 8))
    assert e.break_reasons == []
    assert e.graph_count == 1


def test_module_parameters_are_read_at_each_call():
    m = LinearReluScale()
    cm = kiln.compile(m)
    with torch.no_grad():
        x = torch.randn(5, 8)
        torch.testing.assert_close(cm(x), m(x))
        assert counters()["graphs_compiled"] == 1
        # in-place updates
        m.fc1.weight.add_(1.0)
        m.scale.mul_(-2.0)
        out = cm(x)
        torch.testing.assert_close(out, m(x))
        # a parameter replaced by a new one of the same shape
        m.fc1.bias = nn.Parameter(torch.randn(16))
        torch.testing.assert_close(cm(x), m(x))
        # a fresh input
        x2 = torch.randn(5, 8)
        torch.testing.assert_close(cm(x2), m(x2))
    assert counters()["eager_fallbacks"] == 0


def test_compiled_module_is_compiled_once_for_same_shapes():
    m = LinearReluScale()
    cm = kiln.compile(m)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(5, 8)
            torch.testing.assert_close(cm(x), m(x))
    c = counters()
    assert c["graphs_compiled"] == 1
    assert c["cache_hits_memory"] == 2


def test_compiled_module_exposes_wrapped_module():
    m = LinearReluScale()
    cm = kiln.compile(m)
    assert isinstance(cm, nn.Module)
    assert cm._orig_mod is m
    assert cm.fc1 is m.fc1
    assert cm.scale is m.scale
    assert {p.data_ptr() for p in cm.parameters()} == {p.data_ptr() for p in m.parameters()}


def test_compiled_module_with_grad_inputs_falls_back_but_is_correct():
    # Parameters require grad and grad mode is on: kiln falls back to eager (no backward graphs).
    m = LinearReluScale()
    cm = kiln.compile(m)
    x = torch.randn(5, 8)
    out = cm(x)
    torch.testing.assert_close(out, m(x))
    out.sum().backward()
    assert m.fc1.weight.grad is not None


class DropoutHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5)

    def forward(self, x, scale=1.0):
        return torch.relu(self.drop(self.fc(x))) * scale


def test_compiled_module_train_eval_switch_and_keyword_arguments():
    m = DropoutHead()
    cm = kiln.compile(m)
    x = torch.randn(6, 8)
    with torch.no_grad():
        m.eval()
        torch.testing.assert_close(cm(x), m(x))
        torch.testing.assert_close(cm(x, scale=3.0), m(x, scale=3.0))
        torch.testing.assert_close(cm(x, 0.5), m(x, 0.5))
        m.train()  # random dropout from kiln's generator: the same seed gives the same mask
        torch.manual_seed(7)
        out = cm(x)
        torch.manual_seed(7)
        torch.testing.assert_close(cm(x), out)
        # each element dropped, or eval's value scaled by 1 / (1 - p) before the ReLU
        kept = torch.relu(m.fc(x)) * 2
        assert bool(((out == 0) | torch.isclose(out, kept)).all())
        m.eval()
        torch.testing.assert_close(cm(x), m(x))


# --------------------------------------------------------------------------------------------
# kiln.explain
# --------------------------------------------------------------------------------------------

def test_explain_str_and_fields():
    def f(inp):
        return torch.sin(inp) + torch.cos(inp)

    x = torch.randn(4, 5)
    e = kiln.explain(f)(x)
    assert isinstance(e, kiln.ExplainOutput)
    text = str(e)
    assert "Graph Count" in text
    assert "Guards" in text and "Kernels" in text
    assert e.graph_count == 1
    assert e.graph_break_count == 0
    assert e.op_count >= 3
    assert len(e.graphs) == 1 and isinstance(e.graphs[0], str)
    assert "sin" in e.graphs[0] and "cos" in e.graphs[0]
    for k in e.kernels:
        assert k.name in text


def test_explain_guards_mention_the_input():
    def f(inp):
        return inp * 3 + 1

    x = torch.randn(4, 5)
    e = kiln.explain(f)(x)
    assert all(isinstance(g, str) for g in e.guards)
    mentioning = [g for g in e.guards if "inp" in g]
    assert mentioning, e.guards
    g = mentioning[0]
    assert "float32" in g
    assert "4" in g and "5" in g


def test_explain_guard_mentions_scalar_argument():
    def f(inp, alpha):
        return inp * alpha

    e = kiln.explain(f)(torch.randn(3), 2.5)
    assert any("alpha" in g and "2.5" in g for g in e.guards), e.guards


def test_explain_kernels_have_readable_names_with_op_names():
    e = kiln.explain(sin_cos)(torch.randn(4, 5))
    assert len(e.kernels) == 1
    k = e.kernels[0]
    assert "sin" in k.name and "cos" in k.name
    assert k.name.isidentifier()
    assert k.name in k.source
    assert str(k) == k.source
    assert k["name"] == k.name  # also readable as a dict

    e = kiln.explain(gelu)(torch.randn(4, 5))
    assert "tanh" in e.kernels[0].name
    e = kiln.explain(softmax_last)(torch.randn(4, 5))
    assert "exp" in e.kernels[0].name


def test_explain_with_arguments_given_directly():
    x = torch.randn(3, 3)
    e = kiln.explain(sin_cos, x)
    assert isinstance(e, kiln.ExplainOutput)
    assert e.graph_count == 1


def test_explain_of_compiled_function_and_module():
    x = torch.randn(4, 5)
    e = kiln.explain(kiln.compile(sin_cos))(x)
    assert e.graph_count == 1 and len(e.kernels) == 1

    m = LinearReluScale()
    with torch.no_grad():
        e = kiln.explain(kiln.compile(m))(torch.randn(5, 8))
        e2 = kiln.explain(m)(torch.randn(5, 8))
    assert e.graph_count == 1 and e2.graph_count == 1
    # the module's parameters appear as guarded inputs, not constants
    assert any("fc1.weight" in g for g in e.guards), e.guards


def test_explain_keyword_arguments():
    def f(x, *, scale=1.0):
        return x * scale

    e = kiln.explain(f)(torch.randn(3), scale=4.0)
    assert e.graph_count == 1
    assert any("scale" in g for g in e.guards), e.guards


# --------------------------------------------------------------------------------------------
# kiln.stats / kiln.reset / kiln.cache_dir
# --------------------------------------------------------------------------------------------

def test_stats_has_documented_keys():
    s = kiln.stats()
    for key in ("frames_captured", "graphs_compiled", "recompiles", "cache_hits_memory",
                "cache_hits_disk", "eager_fallbacks", "kernels_generated", "fallback_reasons"):
        assert key in s
    assert isinstance(s["fallback_reasons"], dict)
    # returns a copy
    s["frames_captured"] = 12345
    assert kiln.stats()["frames_captured"] != 12345


def test_reset_zeroes_counters():
    kiln.compile(sin_cos)(torch.randn(3))
    assert counters()["frames_captured"] == 1
    kiln.reset()
    assert all(v == 0 for v in counters().values())
    assert kiln.stats()["fallback_reasons"] == {}


def test_cache_dir_follows_env():
    if "KILN_CACHE_DIR" in os.environ:
        assert os.path.abspath(kiln.cache_dir()) == os.path.abspath(os.environ["KILN_CACHE_DIR"])
    else:
        assert isinstance(kiln.cache_dir(), str) and kiln.cache_dir()


def test_ops_doc_is_the_registry():
    # docs/ops.md is generated from kiln._C.ops(): regenerate it with tools/gen_ops_md.py
    import importlib.util
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("gen_ops_md", root / "tools" / "gen_ops_md.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert (root / "docs" / "ops.md").read_text() == gen.render()
    names = {o["name"] for o in kiln._C.ops()}
    assert {"add", "softmax", "conv2d", "slice", "select", "torch_call"} <= names


def test_a_compiled_function_carries_the_wrapped_functions_name_and_docs():
    """As torch.compile's (functools.wraps): __name__, __qualname__, __module__, __doc__,
    __wrapped__, and a __dict__ that functools.update_wrapper and users can write."""
    import functools

    def scaled(x, *, scale=2.0):
        "Scales x."
        return x * scale

    f = kiln.compile(scaled)
    for attr in ("__name__", "__qualname__", "__module__", "__doc__"):
        assert getattr(f, attr) == getattr(scaled, attr), attr
    assert f.__wrapped__ is scaled
    f.tag = "kept"
    assert f.__dict__["tag"] == "kept"

    @functools.wraps(f)
    def outer(x):
        return f(x) + 1

    assert outer.__name__ == "scaled" and outer.__doc__ == "Scales x."
    x = torch.randn(5)
    torch.testing.assert_close(outer(x), x * 2 + 1)


def test_a_compiled_modules_training_flag_is_the_modules():
    mod = torch.nn.Linear(3, 3).eval()
    opt = kiln.compile(mod)
    assert opt.training is False
    opt.train()
    assert opt.training and mod.training
    mod.eval()
    assert not opt.training


def test_a_compiled_module_deep_copies():
    import copy

    opt = kiln.compile(torch.nn.Linear(2, 3))
    x = torch.randn(1, 2)
    c = copy.deepcopy(opt)
    assert c._orig_mod is not opt._orig_mod
    torch.testing.assert_close(c(x), opt(x))
    with torch.no_grad():
        c._orig_mod.weight.add_(1)  # the copy's own parameters
    torch.testing.assert_close(c(x), c._orig_mod(x))
    assert not torch.allclose(c(x), opt(x))


def test_identical_views_of_identical_computations_are_tensors_of_their_own():
    """x, y = v * 2, v * 2; return x[0], y[0]: CSE may merge x and y, but the two outputs view
    memory of their own in eager, and an in-place change of one must not show in the other."""
    def fn(v):
        x, y = v * 2, v * 2
        return x[0], y[0], (v + 1).t(), (v + 1).t(), (v * 3).reshape(-1), (v * 3).reshape(-1)

    outs = {}
    for name, f in (("eager", fn), ("kiln", kiln.compile(fn))):
        o = f(torch.ones(2, 2))
        o[0].add_(10), o[2].add_(5), o[4].add_(7)
        outs[name] = o
    for a, b in zip(outs["kiln"], outs["eager"]):
        torch.testing.assert_close(a, b)


def test_a_forward_set_on_the_instance_and_an_own_call_run_as_eager():
    """m(x) runs the instance's `forward` where one is set (a patch), and a class's own
    `__call__`: kiln went to the class's forward."""
    import types

    class M(nn.Module):
        def forward(self, x):
            return torch.cos(x)

    class Own(nn.Module):
        def __call__(self, x):
            return 5 * self.forward(x)

        def forward(self, x):
            return x * 3

    m = M()
    m.forward = types.MethodType(lambda self, x: torch.sin(x) - 1, m)
    own = Own()
    x = torch.randn(3)
    for mod in (m, own):
        outer = lambda x, mod=mod: mod(x) + 1  # noqa: E731
        torch.testing.assert_close(kiln.compile(outer)(x), outer(x))
        torch.testing.assert_close(kiln.compile(mod)(x), mod(x))


def test_an_attribute_set_on_a_compiled_module_reaches_the_module():
    class S(nn.Module):
        def __init__(self):
            super().__init__()
            self.step = 10

        def forward(self, x):
            return x + self.step

    m = S()
    c = kiln.compile(m)
    c(torch.zeros(1))
    c.step = 20
    assert m.step == 20
    torch.testing.assert_close(c(torch.zeros(1)), torch.full((1,), 20.0))


def test_a_compiled_module_saves_and_loads():
    """torch.save of a compiled module: the module, compiled again with the same keywords
    where it is loaded (torch.compile's wrapper pickles too)."""
    import io

    m = nn.Linear(4, 4)
    c = kiln.compile(m, dynamic=False)
    x = torch.randn(2, 4)
    buf = io.BytesIO()
    torch.save(c, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert isinstance(loaded, kiln.CompiledModule) and loaded._orig_mod is not m
    assert loaded._kiln_args["dynamic"] is False
    torch.testing.assert_close(loaded(x), c(x))
