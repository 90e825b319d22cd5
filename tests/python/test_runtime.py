"""Tests of kiln's runtime behaviour: guards and recompiles, the cache limit, eager fallback
with reasons, fullgraph, error parity with eager, the on-disk kernel cache across processes
(including corrupt entries), KILN_DEBUG / KILN_LOGS, kiln.reset, and the shapes of values a
compiled function can take and return.

Every numerical check compares a compiled call with the eager call on fresh random inputs.
"""
from __future__ import annotations

import glob
import inspect
import json
import os
import warnings

import pytest
import torch

import kiln

from _process import KILN_ROOT, child_env, child_result, counters, delta, run_child
THIS_FILE = os.path.basename(__file__)



# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def _fresh_kiln():
    """Each test starts with empty in-memory caches and zeroed counters."""
    kiln.reset()
    yield
    kiln.reset()


def line_of(fn, marker: str) -> int:
    """The absolute line number of the first source line of fn containing marker."""
    lines, first = inspect.getsourcelines(fn)
    for i, text in enumerate(lines):
        if marker in text:
            return first + i
    raise AssertionError(f"{marker!r} not in the source of {fn.__name__}")


def raised(fn, *args, **kwargs) -> BaseException:
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - the exception is the result
        return e
    raise AssertionError(f"{fn!r} did not raise")


def assert_same_error(fn, *args, **kwargs):
    """The compiled fn raises exactly what eager fn raises: same type, same message."""
    eager = raised(fn, *args, **kwargs)
    compiled = raised(kiln.compile(fn), *args, **kwargs)
    assert type(compiled) is type(eager), (type(compiled), compiled, type(eager), eager)
    assert str(compiled) == str(eager)
    return compiled


# A child that compiles one function on fixed-seed inputs, checks it against eager and prints
# its stats as JSON.
DISK_CHILD = """
    import json, torch, kiln
    torch.manual_seed(1234)
    def f(x, y):
        return torch.tanh(x) * 3.0 + torch.exp(y) - x * y
    x, y = torch.randn(13, 17), torch.randn(13, 17)
    out = kiln.compile(f)(x, y)
    ok = bool(torch.allclose(out, f(x, y), rtol=1.3e-6, atol=1e-5))
    s = kiln.stats()
    print(json.dumps({"ok": ok, "cache_hits_disk": s["cache_hits_disk"],
                      "graphs_compiled": s["graphs_compiled"],
                      "eager_fallbacks": s["eager_fallbacks"],
                      "cache_dir": kiln.cache_dir()}))
"""


# --------------------------------------------------------------------------------------------
# guards and recompiles
# --------------------------------------------------------------------------------------------

def test_same_shapes_do_not_recompile():
    def f(x, y):
        return torch.sin(x) * y + 1

    cf = kiln.compile(f)
    x, y = torch.randn(6, 4), torch.randn(6, 4)
    torch.testing.assert_close(cf(x, y), f(x, y))
    first = counters()
    assert first["graphs_compiled"] == 1 and first["recompiles"] == 0
    for _ in range(4):
        x, y = torch.randn(6, 4), torch.randn(6, 4)
        torch.testing.assert_close(cf(x, y), f(x, y))
    d = delta(first, counters())
    assert d["recompiles"] == 0
    assert d["graphs_compiled"] == 0
    assert d["frames_captured"] == 0
    assert d["cache_hits_memory"] == 4


def test_new_shape_recompiles_and_old_shape_is_still_cached():
    def f(x):
        return torch.cos(x) + x

    cf = kiln.compile(f)
    x = torch.randn(4, 4)
    torch.testing.assert_close(cf(x), f(x))
    before = counters()
    x2 = torch.randn(4, 9)
    torch.testing.assert_close(cf(x2), f(x2))
    d = delta(before, counters())
    assert d["recompiles"] == 1
    assert d["graphs_compiled"] == 1
    why = kiln.stats()["recompile_reasons"][-1]
    assert why.startswith("test_new_shape_recompiles") and "L['x']" in why and "size" in why, why
    # back to the first shape: an in-memory hit, no new compile
    before = counters()
    x3 = torch.randn(4, 4)
    torch.testing.assert_close(cf(x3), f(x3))
    d = delta(before, counters())
    assert d["recompiles"] == 0 and d["graphs_compiled"] == 0
    assert d["cache_hits_memory"] == 1


def test_new_rank_recompiles():
    def f(x):
        return x * 2 - 1

    cf = kiln.compile(f)
    cf(torch.randn(8))
    before = counters()
    x = torch.randn(2, 4)
    torch.testing.assert_close(cf(x), f(x))
    assert delta(before, counters())["recompiles"] == 1


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.int32])
def test_new_dtype_recompiles(dtype):
    def f(x):
        return x * 3 + 2

    cf = kiln.compile(f)
    x = torch.randn(5, 6)
    torch.testing.assert_close(cf(x), f(x))
    before = counters()
    x2 = torch.randn(5, 6).to(dtype) if dtype.is_floating_point else torch.randint(-50, 50, (5, 6), dtype=dtype)
    out = cf(x2)
    assert out.dtype == f(x2).dtype
    torch.testing.assert_close(out, f(x2))
    d = delta(before, counters())
    assert d["recompiles"] == 1
    assert d["graphs_compiled"] == 1


def test_new_strides_recompile_and_are_correct():
    def f(x):
        return x * 2 + 1

    cf = kiln.compile(f)
    x = torch.randn(4, 6)
    torch.testing.assert_close(cf(x), f(x))
    before = counters()
    xt = torch.randn(6, 4).t()  # same shape, transposed strides
    torch.testing.assert_close(cf(xt), f(xt))
    xs = torch.randn(4, 12)[:, ::2]  # same shape, strided
    torch.testing.assert_close(cf(xs), f(xs))
    d = delta(before, counters())
    assert d["recompiles"] == 2


def test_python_scalar_value_change_recompiles():
    def f(x, alpha):
        return x * alpha + 1

    cf = kiln.compile(f)
    x = torch.randn(3, 5)
    torch.testing.assert_close(cf(x, 2.0), f(x, 2.0))
    before = counters()
    torch.testing.assert_close(cf(x, 3.0), f(x, 3.0))
    d = delta(before, counters())
    assert d["recompiles"] == 1
    assert d["graphs_compiled"] == 1
    # the same value again hits the cache
    before = counters()
    torch.testing.assert_close(cf(x, 3.0), f(x, 3.0))
    assert delta(before, counters())["recompiles"] == 0


def test_python_scalar_type_change_recompiles():
    def f(x, alpha):
        return x * alpha

    cf = kiln.compile(f)
    x = torch.randint(-5, 5, (4,))
    out_f = cf(x, 3.0)
    torch.testing.assert_close(out_f, f(x, 3.0))
    before = counters()
    out_i = cf(x, 3)  # 3 == 3.0 but int: different result dtype
    assert out_i.dtype == torch.int64 and out_f.dtype == torch.float32
    torch.testing.assert_close(out_i, f(x, 3))
    assert delta(before, counters())["recompiles"] == 1


def test_python_bool_argument_selects_branch():
    def f(x, flag):
        if flag:
            return x + 1
        return x - 1

    cf = kiln.compile(f)
    x = torch.randn(3)
    torch.testing.assert_close(cf(x, True), x + 1)
    torch.testing.assert_close(cf(x, False), x - 1)
    torch.testing.assert_close(cf(x, True), x + 1)
    c = counters()
    assert c["graphs_compiled"] == 2
    assert c["eager_fallbacks"] == 0


SCALE = 2.0
ACTIVATION = torch.relu
OFFSET = torch.ones(4, 6)


def test_global_scalar_change_is_seen():
    global SCALE

    def f(x):
        return x * SCALE

    cf = kiln.compile(f)
    x = torch.randn(4, 6)
    try:
        torch.testing.assert_close(cf(x), x * 2.0)
        SCALE = 5.0
        torch.testing.assert_close(cf(x), x * 5.0)
    finally:
        SCALE = 2.0


def test_global_function_identity_change_recompiles():
    global ACTIVATION

    def f(x):
        return ACTIVATION(x) + 1

    cf = kiln.compile(f)
    x = torch.randn(4, 6)
    try:
        torch.testing.assert_close(cf(x), torch.relu(x) + 1)
        before = counters()
        ACTIVATION = torch.sigmoid
        torch.testing.assert_close(cf(x), torch.sigmoid(x) + 1)
        assert delta(before, counters())["recompiles"] == 1
    finally:
        ACTIVATION = torch.relu


def test_global_tensor_is_not_baked_in():
    global OFFSET

    def f(x):
        return x + OFFSET

    cf = kiln.compile(f)
    x = torch.randn(4, 6)
    try:
        torch.testing.assert_close(cf(x), x + 1.0)
        OFFSET.fill_(7.0)  # mutated in place
        torch.testing.assert_close(cf(x), x + 7.0)
        OFFSET = torch.full((4, 6), 3.0)  # rebound
        torch.testing.assert_close(cf(x), x + 3.0)
    finally:
        OFFSET = torch.ones(4, 6)


def test_requires_grad_input_compiles_forward_and_backward():
    def f(x):
        return torch.sin(x) * 2

    cf = kiln.compile(f)
    x = torch.randn(4, 6, requires_grad=True)
    out = cf(x)
    torch.testing.assert_close(out, f(x))
    assert out.requires_grad and out.grad_fn.name() == "CompiledFunctionBackward"
    out.sum().backward()
    torch.testing.assert_close(x.grad, 2 * torch.cos(x.detach()))
    s = kiln.stats()
    assert s["eager_fallbacks"] == 0 and s["backward_graphs_compiled"] == 1


def test_requires_grad_input_under_no_grad_is_compiled():
    def f(x):
        return torch.sin(x) * 2

    cf = kiln.compile(f)
    x = torch.randn(4, 6, requires_grad=True)
    with torch.no_grad():
        out = cf(x)
        torch.testing.assert_close(out, f(x))
    assert not out.requires_grad
    c = counters()
    assert c["graphs_compiled"] == 1 and c["eager_fallbacks"] == 0


def test_grad_mode_change_recompiles():
    def f(x):
        return x.exp()

    cf = kiln.compile(f)
    x = torch.randn(5)
    torch.testing.assert_close(cf(x), f(x))
    before = counters()
    with torch.no_grad():
        torch.testing.assert_close(cf(x), f(x))
    assert delta(before, counters())["recompiles"] == 1


# --------------------------------------------------------------------------------------------
# cache limit
# --------------------------------------------------------------------------------------------

def test_cache_limit_option_runs_eagerly_with_user_warning():
    def f(x):
        return torch.sin(x) * 2

    cf = kiln.compile(f, dynamic=False, options={"cache_limit": 2})  # one entry per size
    for n in (1, 2):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no warning before the limit
            x = torch.randn(n, 3)
            torch.testing.assert_close(cf(x), f(x))
    assert counters()["graphs_compiled"] == 2
    x = torch.randn(3, 3)
    with pytest.warns(UserWarning, match="cache_limit|recompile"):
        out = cf(x)
    torch.testing.assert_close(out, f(x))
    before = counters()
    for n in (4, 5, 6):
        x = torch.randn(n, 3)
        torch.testing.assert_close(cf(x), f(x))
    d = delta(before, counters())
    assert d["graphs_compiled"] == 0
    assert counters()["eager_fallbacks"] >= 1
    # shapes compiled before the limit still give correct results
    x = torch.randn(1, 3)
    torch.testing.assert_close(cf(x), f(x))


def test_cache_limit_warning_points_at_the_caller():
    def f(x):
        return x + 1

    cf = kiln.compile(f, options={"cache_limit": 1})
    cf(torch.randn(1))
    with pytest.warns(UserWarning) as record:
        cf(torch.randn(2))
    assert any(os.path.basename(w.filename) == THIS_FILE for w in record), \
        [(w.filename, w.lineno) for w in record]


def test_default_cache_limit_is_eight():
    def f(x):
        return torch.cos(x) - 1

    cf = kiln.compile(f, dynamic=False)  # one entry per size
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in range(1, 9):
            x = torch.randn(n)
            torch.testing.assert_close(cf(x), f(x))
    assert counters()["graphs_compiled"] == 8
    x = torch.randn(9)
    with pytest.warns(UserWarning):
        out = cf(x)
    torch.testing.assert_close(out, f(x))
    assert counters()["graphs_compiled"] == 8


# --------------------------------------------------------------------------------------------
# unsupported constructs: eager fallback with a reason, fullgraph raises
# --------------------------------------------------------------------------------------------

def branch_on_data(x):
    y = x * 2
    if y.sum() > 0:  # MARK
        return y + 1
    return y - 1


def calls_print(x):
    y = x + 1
    print("kiln test print")  # MARK
    return y * 2


def calls_item(x):
    s = x.sum().item()  # MARK
    return x * s


UNSUPPORTED = [branch_on_data, calls_print, calls_item]


@pytest.mark.parametrize("fn", UNSUPPORTED, ids=lambda f: f.__name__)
def test_unsupported_construct_matches_eager(fn):
    cf = kiln.compile(fn)
    for _ in range(2):
        for sign in (1.0, -1.0):  # both sides of the data-dependent branch
            x = torch.rand(4, 5) * sign
            torch.testing.assert_close(cf(x), fn(x))
    s = kiln.stats()
    assert s["graph_breaks"] >= 1
    assert s["fallback_reasons"]


@pytest.mark.parametrize("fn", UNSUPPORTED, ids=lambda f: f.__name__)
def test_unsupported_construct_explain_gives_reason_and_location(fn):
    e = kiln.explain(fn)(torch.randn(4, 5))
    assert e.break_reasons, str(e)
    r = e.break_reasons[0]
    assert isinstance(r["reason"], str) and r["reason"].strip()
    loc = r["location"]
    assert THIS_FILE in loc, loc
    assert loc.endswith(f":{line_of(fn, '# MARK')}"), loc
    assert "Break Reasons" in str(e)


def test_print_runs_once_per_call(capsys):
    cf = kiln.compile(calls_print)
    x = torch.randn(3)
    torch.testing.assert_close(cf(x), calls_print(x))
    assert capsys.readouterr().out.count("kiln test print") == 2


@pytest.mark.parametrize("fn", UNSUPPORTED, ids=lambda f: f.__name__)
def test_fullgraph_raises_on_unsupported_construct(fn):
    cf = kiln.compile(fn, fullgraph=True)
    with pytest.raises(Exception) as err:
        cf(torch.randn(4, 5))
    assert THIS_FILE in str(err.value)


def test_fullgraph_compiles_supported_code():
    def f(x):
        return torch.softmax(x * 2, dim=-1)

    cf = kiln.compile(f, fullgraph=True)
    x = torch.randn(3, 7)
    torch.testing.assert_close(cf(x), f(x))
    assert counters()["graphs_compiled"] == 1


# --------------------------------------------------------------------------------------------
# bad input: the same errors as eager
# --------------------------------------------------------------------------------------------

def two_args(x, y):
    return x + y


@pytest.mark.parametrize("args,kwargs", [
    ((torch.randn(3),), {}),
    ((torch.randn(3), torch.randn(3), torch.randn(3)), {}),
    ((), {}),
    ((torch.randn(3),), {"z": torch.randn(3)}),
    ((torch.randn(3), torch.randn(3)), {"x": torch.randn(3)}),
], ids=["too_few", "too_many", "none", "unexpected_kw", "duplicate_kw"])
def test_wrong_arguments_raise_same_type_error_as_eager(args, kwargs):
    err = assert_same_error(two_args, *args, **kwargs)
    assert isinstance(err, TypeError)


def test_broadcast_shape_error_matches_eager():
    def f(x, y):
        return x + y

    err = assert_same_error(f, torch.randn(3), torch.randn(4))
    assert isinstance(err, RuntimeError)


def test_shape_error_after_fusable_ops_matches_eager():
    def f(x, y):
        return torch.sin(x) * 2 + torch.cos(y)

    assert_same_error(f, torch.randn(3), torch.randn(4))


@pytest.mark.parametrize("op", ["mm", "matmul_operator", "matmul"])
def test_mm_shape_mismatch_matches_eager(op):
    fns = {"mm": lambda a, b: torch.mm(a, b), "matmul_operator": lambda a, b: a @ b,
           "matmul": lambda a, b: torch.matmul(a, b)}
    assert_same_error(fns[op], torch.randn(3, 4), torch.randn(5, 6))


def test_compiled_function_still_works_after_an_error():
    def f(x, y):
        return x * y + 1

    cf = kiln.compile(f)
    with pytest.raises(RuntimeError):
        cf(torch.randn(3), torch.randn(4))
    x, y = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(cf(x, y), f(x, y))


# --------------------------------------------------------------------------------------------
# on-disk cache across processes
# --------------------------------------------------------------------------------------------

def test_disk_cache_hit_in_second_process(tmp_path):
    cache = tmp_path / "cache"
    first = child_result(run_child(DISK_CHILD, cache))
    assert first["ok"]
    assert first["cache_hits_disk"] == 0
    assert first["graphs_compiled"] >= 1
    assert os.path.abspath(first["cache_dir"]) == os.path.abspath(str(cache))
    second = child_result(run_child(DISK_CHILD, cache))
    assert second["ok"]
    assert second["cache_hits_disk"] >= 1
    assert second["eager_fallbacks"] == 0


def test_corrupt_cache_entry_is_rebuilt(tmp_path):
    cache = tmp_path / "cache"
    first = child_result(run_child(DISK_CHILD, cache))
    assert first["ok"]
    sos = glob.glob(str(cache / "cpu" / "*.so"))
    assert sos, os.listdir(cache)
    sums = glob.glob(str(cache / "cpu" / "*.sum"))
    assert sums
    for so in sos:
        with open(so, "wb") as fh:
            fh.write(b"this is not a shared object \x00\xff" * 16)
    third = child_result(run_child(DISK_CHILD, cache))
    assert third["ok"]
    assert third["cache_hits_disk"] == 0
    assert third["eager_fallbacks"] == 0
    assert all(os.path.exists(s) for s in sums)  # .sum files untouched by the test
    # the rebuilt entry is good: the next process hits it
    fourth = child_result(run_child(DISK_CHILD, cache))
    assert fourth["ok"]
    assert fourth["cache_hits_disk"] >= 1


def test_corrupt_cache_entry_same_size_is_rebuilt(tmp_path):
    """Garbage of the original length, so only the checksum can tell."""
    cache = tmp_path / "cache"
    assert child_result(run_child(DISK_CHILD, cache))["ok"]
    sos = glob.glob(str(cache / "cpu" / "*.so"))
    assert sos
    for so in sos:
        size = os.path.getsize(so)
        with open(so, "r+b") as fh:
            fh.write(os.urandom(size))
    res = child_result(run_child(DISK_CHILD, cache))
    assert res["ok"]
    assert res["cache_hits_disk"] == 0


# --------------------------------------------------------------------------------------------
# KILN_DEBUG and KILN_LOGS
# --------------------------------------------------------------------------------------------

def _read_tree(root) -> dict:
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "r", errors="replace") as fh:
                out[path] = fh.read()
    return out


def test_kiln_debug_writes_graph_and_kernel_source(tmp_path):
    debug = tmp_path / "debug"
    res = child_result(run_child(DISK_CHILD, tmp_path / "cache", {"KILN_DEBUG": str(debug)}))
    assert res["ok"]
    files = _read_tree(debug)
    assert files, f"nothing written under {debug}"
    # the graph: the captured ops appear in a graph dump
    graph_files = [p for p, t in files.items() if "tanh" in t and "exp" in t and "graph" in t]
    assert graph_files, list(files)
    # the kernel source: generated C++ with a kernel entry point
    kernel_files = [p for p, t in files.items() if 'extern "C"' in t and "kernel" in t]
    assert kernel_files, list(files)


def test_kiln_debug_kernel_names_match_explain(tmp_path):
    debug = tmp_path / "debug"
    code = """
        import json, torch, kiln
        def f(x):
            return torch.sin(x) + torch.cos(x)
        x = torch.randn(4, 5)
        torch.testing.assert_close(kiln.compile(f)(x), f(x))
        print(json.dumps({"ok": True}))
    """
    assert child_result(run_child(code, tmp_path / "cache", {"KILN_DEBUG": str(debug)}))["ok"]

    def f(x):
        return torch.sin(x) + torch.cos(x)

    names = [k.name for k in kiln.explain(f)(torch.randn(4, 5)).kernels]
    text = "\n".join(_read_tree(debug).values())
    for name in names:
        assert name in text


def test_kiln_logs_prints_to_stderr(tmp_path):
    quiet = run_child(DISK_CHILD, tmp_path / "cache")
    assert child_result(quiet)["ok"]
    loud = run_child(DISK_CHILD, tmp_path / "cache", {"KILN_LOGS": "guards,kernels"})
    assert child_result(loud)["ok"]
    assert loud.stderr.strip(), "KILN_LOGS=guards,kernels printed nothing to stderr"
    assert len(loud.stderr) > len(quiet.stderr)
    low = loud.stderr.lower()
    assert "guard" in low
    assert "kernel" in low


def test_kiln_logs_fallback_names_the_reason(tmp_path):
    code = """
        import json, torch, kiln
        def f(x):
            return x * x.sum().item()
        x = torch.randn(4)
        torch.testing.assert_close(kiln.compile(f)(x), f(x))
        print(json.dumps({"ok": True}))
    """
    proc = run_child(code, tmp_path / "cache", {"KILN_LOGS": "graph_breaks"})
    assert child_result(proc)["ok"]
    assert "item" in proc.stderr, proc.stderr


# --------------------------------------------------------------------------------------------
# kiln.reset
# --------------------------------------------------------------------------------------------

def test_reset_makes_next_call_capture_again():
    def f(x):
        return torch.exp(x) - 1

    cf = kiln.compile(f)
    x = torch.randn(5, 5)
    cf(x)
    cf(x)
    assert counters()["frames_captured"] == 1
    kiln.reset()
    assert counters()["frames_captured"] == 0
    before = counters()
    x = torch.randn(5, 5)
    torch.testing.assert_close(cf(x), f(x))
    after = counters()
    assert after["frames_captured"] > before["frames_captured"]
    assert after["cache_hits_memory"] == 0


# --------------------------------------------------------------------------------------------
# what a compiled function takes and returns
# --------------------------------------------------------------------------------------------

def test_returns_tuple():
    def f(x):
        return x + 1, x * 2

    x = torch.randn(4, 3)
    out = kiln.compile(f)(x)
    assert isinstance(out, tuple) and len(out) == 2
    torch.testing.assert_close(out, f(x))
    assert counters()["graphs_compiled"] == 1


def test_returns_constants_alongside_tensors():
    def f(x):
        return x + 1, 42, "tag", None, 2.5, x.shape, x.sum()

    x = torch.randn(4, 3)
    out = kiln.compile(f)(x)
    ref = f(x)
    assert isinstance(out, tuple) and len(out) == len(ref)
    torch.testing.assert_close(out[0], ref[0])
    assert out[1:6] == ref[1:6]
    assert type(out[1]) is int and type(out[4]) is float
    torch.testing.assert_close(out[6], ref[6])


def test_returns_input_unchanged():
    def f(x):
        return x

    x = torch.randn(3, 3)
    out = kiln.compile(f)(x)
    assert out is x


def test_returns_inputs_reordered():
    def f(x, y):
        return y, x

    x, y = torch.randn(2), torch.randn(3)
    a, b = kiln.compile(f)(x, y)
    assert a is y and b is x


def test_returns_list_and_dict():
    def f(x):
        return [x + 1, {"double": x * 2}]

    x = torch.randn(3)
    out = kiln.compile(f)(x)
    assert isinstance(out, list) and isinstance(out[1], dict)
    torch.testing.assert_close(out, f(x))


def test_keyword_and_default_arguments():
    def f(x, y, alpha=2.0, *, beta=1.0):
        return x * alpha + y * beta

    cf = kiln.compile(f)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    calls = [((x, y), {}), ((x, y, 3.0), {}), ((x,), {"y": y}),
             ((x, y), {"alpha": 0.5, "beta": -1.0}), ((), {"x": x, "y": y, "beta": 4.0}),
             ((x, y), {"beta": 1.0})]
    for args, kwargs in calls:
        torch.testing.assert_close(cf(*args, **kwargs), f(*args, **kwargs))
    assert counters()["eager_fallbacks"] == 0


def test_default_tensor_argument():
    default = torch.randn(3)

    def f(x, bias=default):
        return x + bias

    cf = kiln.compile(f)
    x = torch.randn(3)
    torch.testing.assert_close(cf(x), x + default)
    other = torch.randn(3)
    torch.testing.assert_close(cf(x, other), x + other)


def test_varargs_and_kwargs():
    def f(*xs, **scales):
        out = xs[0]
        for t in xs[1:]:
            out = out + t
        return out * scales.get("s", 1.0)

    cf = kiln.compile(f)
    a, b, c = torch.randn(4), torch.randn(4), torch.randn(4)
    torch.testing.assert_close(cf(a, b, c, s=2.0), f(a, b, c, s=2.0))
    torch.testing.assert_close(cf(a, b), f(a, b))


def test_zero_size_and_scalar_tensors():
    def f(x):
        return torch.sin(x) * 2 + 1

    cf = kiln.compile(f)
    for x in (torch.randn(0, 3), torch.tensor(1.5), torch.randn(1)):
        out = cf(x)
        assert out.shape == x.shape
        torch.testing.assert_close(out, f(x))


def test_inputs_are_not_mutated():
    def f(x):
        return torch.relu(x) * 2

    x = torch.randn(6, 6)
    snapshot = x.clone()
    kiln.compile(f)(x)
    assert torch.equal(x, snapshot)


@pytest.mark.parametrize("name", [
    "t", "transpose", "permute", "unsqueeze", "view", "reshape", "flatten"])
def test_returned_view_of_input_aliases_input(name):
    fns = {"t": lambda x: x.t(), "transpose": lambda x: x.transpose(0, 1),
           "permute": lambda x: x.permute(1, 0), "unsqueeze": lambda x: x.unsqueeze(0),
           "view": lambda x: x.view(24), "reshape": lambda x: x.reshape(24),
           "flatten": lambda x: x.flatten()}
    fn = fns[name]
    x = torch.randn(4, 6)
    eager = fn(x)
    assert eager.data_ptr() == x.data_ptr()  # eager returns a view
    out = kiln.compile(fn)(x)
    torch.testing.assert_close(out, eager)
    assert out.data_ptr() == x.data_ptr()
    out.select(0, 0).fill_(123.0)  # a write through the result is seen through x (and eager)
    assert torch.equal(eager.select(0, 0), torch.full_like(eager.select(0, 0), 123.0))


def test_cpu_programs_keep_their_temporaries_and_never_hand_them_out():
    """CPU programs reuse their temporaries' memory from call to call (executor.cpp,
    PreparedProgram::keeps_memory): results of earlier calls stay as they were, and threads
    calling one compiled function at once each get memory of their own."""
    import threading
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU6(),
                              torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.Hardtanh(-0.5, 0.5),
                              torch.nn.Conv2d(8, 4, 1)).eval()
    f = kiln.compile(net)
    with torch.no_grad():
        xs = [torch.randn(2, 3, 16, 16) for _ in range(3)]
        outs = [f(x) for x in xs]
        for x, out in zip(xs, outs):
            torch.testing.assert_close(out, net(x), rtol=1e-4, atol=1e-4)
        errors = []

        def worker(seed):
            g = torch.Generator().manual_seed(seed)
            try:
                with torch.no_grad():
                    for _ in range(10):
                        x = torch.randn(2, 3, 16, 16, generator=g)
                        torch.testing.assert_close(f(x), net(x), rtol=1e-4, atol=1e-4)
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[0]


def test_kept_cpu_temporaries_under_inference_mode_and_no_grad_in_turn():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU6(), torch.nn.Conv2d(8, 4, 1)).eval()
    f = kiln.compile(net)
    for i in range(4):
        x = torch.randn(1, 3, 9, 9)
        with (torch.inference_mode() if i % 2 else torch.no_grad()):
            out, ref = f(x), net(x)
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
        assert out.is_inference() == bool(i % 2)


def test_large_cpu_outputs_reuse_the_memory_of_dropped_results():
    """A CPU program's large outputs come from its output pool (output_pool.h): a result the
    caller dropped gives its memory to the next call's result, and a result the caller keeps
    is never written by a later call."""
    torch.manual_seed(0)
    fn = lambda x: torch.softmax(x * 2.0, dim=-1)  # noqa: E731
    f = kiln.compile(fn, fullgraph=True)
    x = torch.randn(512, 512)  # 1 MiB result: above the pool's threshold
    first = f(x)
    torch.testing.assert_close(first, fn(x))
    address = first.data_ptr()
    del first
    other_tensor = torch.empty(512, 512)  # would get the freed block, had it gone back to glibc
    again_x = torch.randn(512, 512)
    again = f(again_x)
    assert again.data_ptr() == address != other_tensor.data_ptr()  # the dropped result's block
    kept = again.clone()
    other = f(torch.randn(512, 512))  # `again` is alive: fresh memory
    assert other.data_ptr() != again.data_ptr()
    torch.testing.assert_close(again, kept, rtol=0, atol=0)
    torch.testing.assert_close(again, fn(again_x))
    assert kiln.stats()["graphs_compiled"] == 1


def test_pooled_outputs_behave_as_torchs_own_tensors():
    """resize_, in-place updates, autograd flags, inference mode, numpy views, and a result that
    outlives its compiled function and dies on another thread."""
    import gc
    import threading
    torch.manual_seed(1)
    fn = lambda x: torch.tanh(x) * 2 + x.sigmoid()  # noqa: E731
    f = kiln.compile(fn, fullgraph=True)
    x = torch.randn(300, 400)
    out = f(x)
    torch.testing.assert_close(out, fn(x))
    assert out.is_contiguous() and not out.requires_grad and out.grad_fn is None
    assert out._version == 0
    out.add_(1)  # in place: a normal tensor with a version counter
    assert out._version == 1
    out.resize_(1000, 1000)  # grows through torch's allocator
    out.fill_(2.0)
    assert out.sum().item() == 2.0 * 1e6
    arr = f(x).numpy()
    np_ref = fn(x).numpy()
    assert (abs(arr - np_ref) < 1e-5).all()
    with torch.inference_mode():
        inf = f(x)
    assert inf.is_inference()
    torch.testing.assert_close(inf, fn(x))
    y = torch.randn(300, 400, requires_grad=True)
    g = f(y)
    (ref := fn(y)).sum().backward()
    grad = y.grad.clone()
    y.grad = None
    g.sum().backward()
    torch.testing.assert_close(y.grad, grad)
    torch.testing.assert_close(g, ref)
    late = f(x)
    del f
    gc.collect()
    box = [late]
    del late
    t = threading.Thread(target=box.clear)  # freed on another thread, after its pool's program
    t.start()
    t.join()
    assert box == []


def test_a_view_op_output_is_a_tensor_of_its_own():
    """b.view(b.shape) and x.view(-1) of a 1-d x are new tensors over their base in eager; a
    metadata change of one (t_, unsqueeze_) must not reach the other."""
    def same_shape(b):
        return b.view(2, 2)

    def pair(a):
        x = a.mul(2)
        return x, x.view(-1)

    b = torch.randn(2, 2)
    out = kiln.compile(same_shape)(b)
    assert out is not b and out._base is b
    out.unsqueeze_(0)
    assert b.shape == (2, 2)
    o0, o1 = kiln.compile(pair)(torch.randn(3))
    assert o0 is not o1 and o1._base is o0
    torch.testing.assert_close(o1, o0)
