"""torch.autocast (issue 10, part 2): autocast's state is guarded, and under autocast kiln's graph
makes the casts autocast's policy makes (matrix products in the lower precision type, CUDA's
float32 ops in float32, reductions given dtype=float32), so results equal eager's under autocast,
dtypes included, and the 16-bit parts compile into kiln's own 16-bit kernels."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import kiln
from _helpers import assert_same

pytestmark = pytest.mark.filterwarnings("ignore:kiln.*runs eagerly")


def _devices():
    out = [("cpu", torch.bfloat16)]
    if torch.cuda.is_available():
        out += [pytest.param("cuda", torch.float16, marks=pytest.mark.gpu),
                pytest.param("cuda", torch.bfloat16, marks=pytest.mark.gpu)]
    return out


def _compare_under_autocast(fn, args, device, dtype):
    cf = kiln.compile(fn)
    with torch.autocast(device, dtype=dtype):
        expected = fn(*args)
        actual = cf(*args)
        again = cf(*args)
    assert_same(actual, expected, rtol=2e-2, atol=2e-2)
    assert_same(again, expected, rtol=2e-2, atol=2e-2)
    return cf


@pytest.mark.parametrize("device,dtype", _devices())
def test_an_entry_compiled_outside_autocast_is_not_reused_inside(device, dtype):
    w = torch.randn(16, 16, device=device)

    def fn(x):
        return torch.relu(x @ w) + 1

    x = torch.randn(8, 16, device=device)
    cf = kiln.compile(fn)
    assert_same(cf(x), fn(x))                      # compiled outside autocast: float32
    with torch.autocast(device, dtype=dtype):
        expected, actual = fn(x), cf(x)
    assert actual.dtype == expected.dtype == dtype  # a new entry, made under autocast
    assert_same(actual, expected, rtol=2e-2, atol=2e-2)
    assert_same(cf(x), fn(x))                      # and outside again: the float32 entry


@pytest.mark.parametrize("device,dtype", _devices())
@pytest.mark.parametrize("name", ["linear", "matmul", "softmax", "exp_sum", "layer_norm", "mean_mix", "conv"])
def test_results_and_dtypes_equal_eager_under_autocast(device, dtype, name):
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 8).to(device)
    ln = torch.nn.LayerNorm(16).to(device)
    conv = torch.nn.Conv2d(3, 4, 3).to(device)
    fns = {
        "linear": (lambda x: F.gelu(lin(x)) * 2, (torch.randn(4, 16, device=device),)),
        "matmul": (lambda a, b: (a @ b).sum(-1), (torch.randn(2, 4, 16, device=device), torch.randn(16, 5, device=device))),
        "softmax": (lambda x: torch.softmax(x, -1) + x, (torch.randn(4, 16, device=device),)),
        "exp_sum": (lambda x: x.exp().sum(0) + torch.log1p(x.abs()).mean(), (torch.randn(4, 16, device=device),)),
        "layer_norm": (lambda x: ln(x) @ x.t(), (torch.randn(4, 16, device=device),)),
        "mean_mix": (lambda x: (lin(x) + x[:, :8]).mean(), (torch.randn(4, 16, device=device),)),
        "conv": (lambda x: torch.relu(conv(x)).sum((2, 3)), (torch.randn(2, 3, 8, 8, device=device),)),
    }
    fn, args = fns[name]
    with torch.no_grad():
        _compare_under_autocast(fn, args, device, dtype)


def test_autocast_state_is_a_guard():
    def fn(x):
        return x * 2

    x = torch.randn(4)
    explained = kiln.explain(fn)(x)
    assert any(g.startswith("AUTOCAST:") for g in explained.guards), explained.guards


def test_transformer_block_under_autocast_is_not_nan():
    torch.manual_seed(0)
    block = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()
    x = torch.randn(2, 6, 32)
    cf = kiln.compile(block)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = block(x)
        actual = cf(x)
    assert not actual.isnan().any()
    assert_same(actual, expected, rtol=5e-2, atol=5e-2)


def test_disabled_autocast_block_inside_a_function():
    w = torch.randn(8, 8)

    def fn(x):
        with torch.autocast("cpu", enabled=False):
            y = x @ w
        return y.relu()

    x = torch.randn(4, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_same(kiln.compile(fn)(x), fn(x))


# ---- `with torch.autocast(...)` inside the function: a captured region, not a break ----

def _region(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ w
        inside = torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")
        z = torch.softmax(y, -1)
    return z * 2, y.dtype, inside, torch.is_autocast_enabled("cpu")


def _region_as_decorator(x, w):
    @torch.autocast("cpu", dtype=torch.bfloat16)
    def inner(a):
        return a @ w
    return inner(x), (x @ w).dtype


def _amp_spelling(x, w):
    with torch.cpu.amp.autocast(dtype=torch.bfloat16):
        return (x @ w).dtype


def _region_default_dtype(x, w):
    with torch.autocast("cpu"):
        return x @ w


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("fn", [_region, _region_as_decorator, _amp_spelling, _region_default_dtype])
def test_autocast_region_inside_a_function_is_captured(fn):
    w, x = torch.randn(16, 16), torch.randn(8, 16)
    explained = kiln.explain(fn)(x, w)
    # capture went through the region, into one graph of kiln's kernels (none where only a
    # dtype comes out)
    assert not explained.break_reasons, explained.break_reasons
    assert explained.graph_count <= 1
    assert_same(kiln.compile(fn)(x, w), fn(x, w), rtol=2e-2, atol=2e-2)


def test_autocast_region_records_the_casts():
    w, x = torch.randn(16, 16), torch.randn(8, 16)
    graph = kiln.explain(_region)(x, w).captured  # the graph as captured, before any pass
    assert "convert" in graph and "bfloat16" in graph


def test_disabling_region_under_outer_autocast_compiles_in_float32():
    w = torch.randn(16, 16)

    def fn(x):
        with torch.autocast("cpu", enabled=False):
            return torch.relu(x @ w) + 1

    x = torch.randn(8, 16)
    cf = kiln.compile(fn)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        before = kiln.stats()["eager_fallbacks"]
        actual, expected = cf(x), fn(x)
        assert kiln.stats()["eager_fallbacks"] == before  # float32 inside: kiln's own kernels
    assert actual.dtype == expected.dtype == torch.float32
    assert_same(actual, expected)


def test_autocast_dtype_default_is_guarded():
    w = torch.randn(16, 16)
    cf = kiln.compile(_region_default_dtype)
    x = torch.randn(8, 16)
    assert cf(x, w).dtype == torch.bfloat16
    torch.set_autocast_dtype("cpu", torch.float16)
    try:
        assert cf(x, w).dtype == _region_default_dtype(x, w).dtype == torch.float16
    finally:
        torch.set_autocast_dtype("cpu", torch.bfloat16)


_LOSSES = {
    "cross_entropy": lambda z, t, w: F.cross_entropy(z, t),
    "nll_loss": lambda z, t, w: F.nll_loss(F.log_softmax(z, -1), t),
    "mse_loss": lambda z, t, w: F.mse_loss(z, w),
    "smooth_l1_loss": lambda z, t, w: F.smooth_l1_loss(z, w),
    "bce_with_logits": lambda z, t, w: F.binary_cross_entropy_with_logits(z, w.sigmoid()),
    "kl_div": lambda z, t, w: F.kl_div(F.log_softmax(z, -1), w.softmax(-1), reduction="batchmean"),
}


@pytest.mark.parametrize("device,dtype", _devices())
@pytest.mark.parametrize("loss", list(_LOSSES))
def test_losses_under_autocast_compute_in_float32_in_one_graph(device, dtype, loss):
    """autocast casts a loss's inputs to float32 on the CPU as on CUDA: a 16-bit linear layer's
    output goes into the loss in one graph, with eager's float32 result and gradients."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 5).to(device)
    t = torch.randint(0, 5, (8,), device=device)
    w = torch.randn(8, 5, device=device)
    fn = lambda x: _LOSSES[loss](lin(x), t, w)  # noqa: E731
    x = torch.randn(8, 16, device=device)
    with torch.autocast(device, dtype=dtype):
        e = kiln.explain(fn)(x)
        assert e.graph_count == 1 and not e.break_reasons, e.break_reasons
        want = fn(x)
        got = kiln.compile(fn)(x)
    assert got.dtype == want.dtype == torch.float32
    assert_same(got, want, rtol=2e-2, atol=2e-2)
    gw = torch.autograd.grad(got, lin.weight)[0]
    ww = torch.autograd.grad(want, lin.weight)[0]
    assert_same(gw, ww, rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("device,dtype", _devices())
@pytest.mark.parametrize("name", ["unbind", "gather", "index_select", "topk", "roll", "repeat", "index", "type_as",
                                  "cumsum", "baddbmm", "einsum", "einsum_one_row", "pad", "repeat_interleave",
                                  "conv1d", "index_copy", "embedding_bag"])
def test_operators_autocast_passes_by_are_captured_under_autocast(device, dtype, name):
    """Operators torch's dispatcher says autocast leaves alone (no autocast kernel, not a
    composite whose inner calls it would cast) run in their inputs' dtypes, in the graph, and
    those with an autocast kernel of their own take its cast: a ViT's qkv.unbind under bf16
    autocast was a graph break per layer."""
    lin = torch.nn.Linear(16, 24).to(device)
    idx = torch.tensor([[0, 3], [2, 1], [5, 5], [1, 0]], device=device)
    rows = torch.tensor([3, 0, 2], device=device)
    tails = {
        "unbind": lambda y: y.view(4, 3, 8).unbind(1)[2] * 2,
        "gather": lambda y: y.gather(1, idx) + 1,
        "index_select": lambda y: y.index_select(0, rows).relu(),
        "topk": lambda y: y.topk(3, 1).values - 1,
        "roll": lambda y: y.roll(2, 1) * y,
        "repeat": lambda y: y.repeat(2, 1).sum(0),
        "index": lambda y: y[rows] + y[:3],
        "type_as": lambda y: y.float().type_as(y) * 2,  # Gemma's RMSNorm: output.type_as(x)
        # on autocast's lists (CUDA's float32 list; the lower precision one): the cast its own
        # kernel makes, found by running it on one-element tensors (probe_autocast)
        "cumsum": lambda y: y.cumsum(1) * 2,
        "baddbmm": lambda y: torch.baddbmm(y.view(4, 3, 8)[:, :, :3], y.view(4, 3, 8), y.view(4, 3, 8).transpose(1, 2)),
        # composites (no autocast kernel; their inner calls are cast: einsum's bmm, which
        # einsum calls only where no dim is of one point) and a composite with a kernel of its
        # own that runs only at the call's sizes (conv1d's kernel is 3 points wide)
        "einsum": lambda y: torch.einsum("bij,bkj->bik", y.view(4, 3, 8), y.view(4, 3, 8)).relu(),
        "einsum_one_row": lambda y: torch.einsum("ij,kj->ik", y[:1], y).relu(),
        "pad": lambda y: torch.nn.functional.pad(y, (1, 2)) * 2,
        "repeat_interleave": lambda y: y.repeat_interleave(2, dim=0) + 1,
        "conv1d": lambda y: torch.nn.functional.conv1d(y.view(4, 3, 8), lin.weight[:5, :9].reshape(5, 3, 3)).relu(),
        # an integer tensor among the inputs (an index), which the probe passes as zeros
        "index_copy": lambda y: y.index_copy(0, rows, y[:3] * 2),
        "embedding_bag": lambda y: torch.nn.functional.embedding_bag(rows, y, torch.tensor([0, 2], device=device)),
    }
    tail = tails[name]

    def fn(x):
        return tail(lin(x))

    x = torch.randn(4, 16, device=device)
    with torch.no_grad(), torch.autocast(device, dtype=dtype):
        e = kiln.explain(fn)(x)
    assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons
    with torch.no_grad():
        _compare_under_autocast(fn, (x,), device, dtype)


def test_rnn_module_under_autocast_is_one_graph():
    """nn.RNNBase asks torch._C._is_any_autocast_enabled() before it checks the input's dtype
    against its weights: answered from the autocast state capture guards."""
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LSTM(8, 6, batch_first=True))
    x = torch.randn(2, 5, 8)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        e = kiln.explain(m)(x)
        assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons
        got, want = kiln.compile(m)(x), m(x)
    assert got[0].dtype == want[0].dtype == torch.bfloat16
    assert_same(got, want, rtol=2e-2, atol=2e-2)


def test_type_as_gives_the_tensor_it_reads_the_type_of_no_gradient():
    """x.type_as(w) reads w's dtype and device only: w.grad stays None, as in eager (under
    autocast the cast is real, and w had been an input of a torch call: a zero gradient)."""
    def fn(a, b):
        return (a @ a.T).type_as(b) * 2

    results = []
    for f in (fn, kiln.compile(fn)):
        torch.manual_seed(0)
        a, b = torch.randn(3, 3, requires_grad=True), torch.randn(1, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = f(a, b)
        out.sum().backward()
        results.append((out, a.grad, b.grad))
    (got, ga, gb), (want, wa, wb) = results[1], results[0]
    assert gb is None and wb is None
    assert_same(got, want, rtol=2e-2, atol=2e-2)
    assert_same(ga, wa, rtol=2e-2, atol=2e-2)


def test_a_torch_python_helper_that_reads_the_device_is_not_run_on_meta_tensors():
    """torch.amp's `_cast` casts a tensor only where its device is the one named: on the meta
    tensors capture works layouts out on, it left a bfloat16 tensor as it was, and the graph
    took the result for bfloat16 (a silent wrong dtype, inside autocast(enabled=False))."""
    from torch.amp.autocast_mode import _cast

    def fn(x, w):
        y = x @ w
        with torch.autocast("cpu", enabled=False):
            a = _cast(y, "cpu", torch.float32)
            return a * 2, a.dtype

    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = kiln.compile(fn)(x, w), fn(x, w)
    assert got[1] == want[1] == torch.float32 and got[0].dtype == torch.float32
    assert_same(got[0], want[0])


class _CastToFloat(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a @ b

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g @ b.T, a.T @ g


def test_custom_fwd_with_cast_inputs_is_one_graph():
    def fn(x, w):
        return _CastToFloat.apply(x @ w, w)

    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        e = kiln.explain(fn)(x, torch.randn(8, 8, requires_grad=True))
    assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons
    results = []
    for f in (fn, kiln.compile(fn)):
        torch.manual_seed(0)
        w = torch.randn(8, 8, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = f(x, w)
        out.sum().backward()
        results.append((out, w.grad))
    assert results[1][0].dtype == results[0][0].dtype == torch.float32
    assert_same(results[1][0], results[0][0], rtol=2e-2, atol=2e-2)
    assert_same(results[1][1], results[0][1], rtol=2e-2, atol=2e-2)
