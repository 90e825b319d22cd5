"""Activations, normalizations, embedding, clamp and masked_fill: functional forms and the
torch.nn modules that wrap them, against eager, on every device."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from _helpers import check


ACTIVATIONS = {
    "silu": lambda x: F.silu(x),
    "hardswish": lambda x: F.hardswish(x),
    "hardsigmoid": lambda x: F.hardsigmoid(x),
    "leaky_relu": lambda x: F.leaky_relu(x, 0.2),
    "leaky_relu_default": lambda x: F.leaky_relu(x),
    "elu": lambda x: F.elu(x, alpha=0.7),
    "softplus": lambda x: F.softplus(x, beta=2.0, threshold=3.0),
    "clamp_both": lambda x: torch.clamp(x, -0.5, 0.5),
    "clamp_min": lambda x: x.clamp(min=0.1),
    "clip_max": lambda x: torch.clip(x, max=0.3),
}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_activations(device, name, dtype):
    x = torch.randn(4, 33, device=device, dtype=dtype) * 4
    check(ACTIVATIONS[name], x)


def test_clamp_promotes_like_torch(device):
    x = torch.randint(-5, 5, (16,), device=device)
    check(lambda x: torch.clamp(x, min=0.5), x)
    check(lambda x: torch.clamp(x, -2, 2), x)


def test_clamp_by_tensor_bounds(device):
    # torch's clamp.Tensor overload: bounds broadcast and promote, and NaN in a bound is NaN
    x = torch.randn(4, 5, device=device)
    lo, hi = torch.randn(5, device=device) - 1, torch.randn(4, 1, device=device) + 1
    lo[2] = float("nan")
    check(lambda x, lo, hi: torch.clamp(x * 2, min=lo, max=hi) + 1, x, lo, hi)
    check(lambda x, lo: (x * 2).clamp(min=lo) - 1, x, lo)
    check(lambda x, hi: x.clip(None, hi), x, hi)
    check(lambda i, lo: torch.clamp(i, lo.double()), torch.randint(-5, 5, (4, 5), device=device), lo)


def test_normalize_is_captured(device):
    # F.normalize draws no random numbers (a name test took it for torch.normal once)
    x = torch.randn(4, 16, device=device)
    check(lambda x: F.normalize(x, dim=-1) @ F.normalize(x, dim=-1).t(), x)


def test_masked_fill(device):
    x = torch.randn(4, 8, device=device)
    m = torch.randn(4, 8, device=device) > 0
    check(lambda x, m: x.masked_fill(m, -1e9), x, m)
    i = torch.randint(0, 9, (4, 8), device=device)
    check(lambda i, m: i.masked_fill(m, 3), i, m)


@pytest.mark.parametrize("shape,norm", [((4, 16), (16,)), ((2, 5, 8), (8,)), ((2, 3, 4, 6), (4, 6))])
def test_layer_norm(device, shape, norm):
    x = torch.randn(*shape, device=device)
    w, b = torch.randn(*norm, device=device), torch.randn(*norm, device=device)
    check(lambda x, w, b: F.layer_norm(x, norm, w, b, eps=1e-6), x, w, b, rtol=1e-4, atol=1e-5)
    check(lambda x: F.layer_norm(x, norm), x, rtol=1e-4, atol=1e-5)


def test_embedding(device):
    w = torch.randn(50, 16, device=device)
    idx = torch.randint(0, 50, (3, 7), device=device)
    check(lambda idx, w: F.embedding(idx, w), idx, w)
    check(lambda idx, w: F.embedding(idx, w, padding_idx=0) * 2, idx, w)


def test_embedding_index_out_of_range_raises_like_eager():
    w = torch.randn(10, 4)
    idx = torch.tensor([1, 12])
    f = lambda idx, w: F.embedding(idx, w)  # noqa: E731
    with pytest.raises(IndexError) as eager:
        f(idx, w)
    with pytest.raises(IndexError) as compiled:
        kiln.compile(f)(idx, w)
    assert str(compiled.value) == str(eager.value)


class TinyTransformerBlock(nn.Module):
    def __init__(self, vocab=100, d=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.act = nn.SiLU()
        self.fc2 = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(0.1)
        self.head = nn.Sequential(nn.Hardswish(), nn.LeakyReLU(0.1, inplace=True), nn.Linear(d, 8), nn.Softplus())

    def forward(self, ids):
        h = self.emb(ids)
        h = h + self.drop(self.fc2(self.act(self.fc1(self.ln(h)))))
        return self.head(h)


def test_module_block_is_one_graph(device):
    m = TinyTransformerBlock().to(device).eval()
    ids = torch.randint(0, 100, (2, 9), device=device)
    with torch.no_grad():
        e = kiln.explain(m)(ids)
        assert e.graph_count == 1 and not e.break_reasons, e
        torch.testing.assert_close(kiln.compile(m)(ids), m(ids), rtol=1e-4, atol=1e-5)


def _decomposed(fn, *args):
    """The graph kiln captured for fn holds no extern call: the norm was decomposed."""
    e = kiln.explain(fn)(*args)
    assert e.graph_count == 1 and not e.break_reasons, e
    assert "extern" not in str(e) and "torch_call" not in str(e), e


@pytest.mark.parametrize("shape,norm", [((4, 16), (16,)), ((2, 5, 8), (8,)), ((2, 3, 4, 6), (4, 6)), ((3, 1), (1,))])
def test_rms_norm(device, shape, norm):
    x = torch.randn(*shape, device=device) * 3
    w = torch.randn(*norm, device=device)
    check(lambda x, w: F.rms_norm(x, norm, w, eps=1e-6), x, w, rtol=1e-4, atol=1e-5)
    check(lambda x: F.rms_norm(x, norm), x, rtol=1e-4, atol=1e-5)  # eps: float32's epsilon
    check(lambda x: torch.rms_norm(x, list(norm), None, 1e-3) + 1, x, rtol=1e-4, atol=1e-5)
    _decomposed(lambda x, w: F.rms_norm(x, norm, w), x, w)


def test_rms_norm_module_and_float64(device):
    m = nn.RMSNorm(12, eps=1e-5).to(device).requires_grad_(False)
    with torch.no_grad():
        m.weight.copy_(torch.randn(12))
    check(m, torch.randn(2, 5, 12, device=device), rtol=1e-4, atol=1e-5)
    m64 = nn.RMSNorm([3, 4]).double().to(device).requires_grad_(False)
    check(m64, torch.randn(2, 3, 4, device=device, dtype=torch.float64))


@pytest.mark.parametrize("x_dtype,w_dtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.bfloat16),
                                             (torch.float32, torch.bfloat16), (torch.float32, torch.float64)])
def test_rms_norm_with_a_weight_of_another_dtype_keeps_the_inputs(device, x_dtype, w_dtype):
    """torch multiplies by the weight in float and casts the result to the input's type: a
    bfloat16 activation and a float32 RMSNorm weight (as under autocast) give bfloat16."""
    x = torch.randn(3, 16, device=device, dtype=x_dtype)
    w = torch.randn(16, device=device, dtype=w_dtype)
    check(lambda x, w: F.rms_norm(x, (16,), w, eps=1e-6), x, w)


def test_rms_norm_shape_mismatch_raises_like_eager():
    x = torch.randn(2, 5)
    with pytest.raises(RuntimeError):
        F.rms_norm(x, (4,))
    with pytest.raises(RuntimeError, match="normalized_shape"):
        kiln.compile(lambda x: F.rms_norm(x, (4,)))(x)


@pytest.mark.parametrize("shape,groups", [((2, 6, 5, 7), 3), ((2, 6, 5, 7), 6), ((3, 8, 10), 2), ((4, 4), 1), ((1, 6, 3, 2, 2), 2)])
def test_group_norm(device, shape, groups):
    x = torch.randn(*shape, device=device) * 2 + 1
    c = shape[1]
    w, b = torch.randn(c, device=device), torch.randn(c, device=device)
    check(lambda x, w, b: F.group_norm(x, groups, w, b, eps=1e-6), x, w, b, rtol=1e-4, atol=1e-5)
    check(lambda x: F.group_norm(x, groups) * 2, x, rtol=1e-4, atol=1e-5)
    _decomposed(lambda x, w, b: F.group_norm(x, groups, w, b), x, w, b)


def test_group_norm_module_fuses_with_activation(device):
    m = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.GroupNorm(4, 8), nn.SiLU()).to(device).eval().requires_grad_(False)
    with torch.no_grad():
        m[1].weight.copy_(torch.randn(8))
        m[1].bias.copy_(torch.randn(8))
    check(m, torch.randn(2, 4, 9, 9, device=device), rtol=1e-4, atol=1e-5)


def test_group_norm_bad_groups_raise_like_eager():
    x = torch.randn(2, 6, 4)
    for groups in (4, 0, -2):  # RuntimeError, ZeroDivisionError, RuntimeError
        with pytest.raises(Exception) as eager:
            F.group_norm(x, groups)
        with pytest.raises(Exception) as compiled:
            kiln.compile(lambda x: F.group_norm(x, groups))(x)
        assert type(compiled.value) is type(eager.value) and str(compiled.value) == str(eager.value)
    one = torch.randn(1, 2)  # one value per group: F.group_norm's own ValueError
    with pytest.raises(ValueError):
        F.group_norm(one, 2)
    with pytest.raises(ValueError):
        kiln.compile(lambda x: F.group_norm(x, 2))(one)


MAX_POOLS = [  # kernel, stride, padding, dilation, ceil_mode
    (3, 2, 1, 1, False), (2, 2, 0, 1, False), (3, 1, 1, 1, True), (3, 2, 1, 2, False),
    ((2, 3), (1, 2), (1, 0), 1, True), (3, 3, 0, 1, True), (1, 1, 0, 1, False),
]


@pytest.mark.parametrize("pool", MAX_POOLS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_max_pool2d_is_a_fused_kernel(device, pool, dtype, channels_last):
    k, s, p, d, ceil = pool

    def f(x):
        return F.max_pool2d(torch.relu(x * 2 - 1), k, s, p, d, ceil_mode=ceil)

    x = torch.randn(2, 5, 11, 9, device=device).to(dtype)
    x[0, 0, 0, 0], x[1, 2, 3, 3], x[1, 3, 4, 4] = float("nan"), float("inf"), -float("inf")
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    out = check(f, x, rtol=0, atol=0)
    assert out.stride() == f(x).stride()
    # The pooling is kiln's own kernel, fused with the ReLU that makes its input.
    kernels = kiln.explain(f)(x).kernels
    assert any("relu" in k.name and "max_pool2d" in k.name for k in kernels), [k.name for k in kernels]


def test_max_pool2d_of_integers_and_unbatched_inputs(device):
    if device == "cpu":  # torch has no integer max_pool2d on CUDA
        check(lambda x: F.max_pool2d(x, 2), torch.randint(-50, 50, (2, 3, 8, 8)))
    check(lambda x: F.max_pool2d(x, 3, 2, 1), torch.randn(5, 11, 9, device=device))
    check(nn.MaxPool2d(3, stride=2, padding=1).to(device), torch.randn(2, 4, 16, 16, device=device))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_boolean_attention_mask_becomes_one_additive_mask(device, dtype):
    # torch turns a boolean mask into an additive one in every call of its operator; kiln does
    # it once per graph (the layers share it), with the same values.
    def f(q, k, v, m):
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        return a + F.scaled_dot_product_attention(q * 2, k, v, attn_mask=m)

    q, k, v = (torch.randn(2, 4, 16, 8, device=device, dtype=dtype) for _ in range(3))
    m = torch.rand(2, 1, 16, 16, device=device) > 0.3
    m[..., 0] = True  # no row fully masked: torch's backends differ there (NaN or zeros)
    check(f, q, k, v, m, rtol=0, atol=0)
    names = [k.name for k in kiln.explain(f)(q, k, v, m).kernels]
    assert sum("where" in n for n in names) == 1, names


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_convolutions_run_channels_last(device, dtype):
    # A residual block over row-major activations: kiln feeds cuDNN (oneDNN on the CPU)
    # channels-last copies (made by the kernels around each convolution) instead of the library
    # converting layouts itself; the result keeps eager's layout.
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
            self.c2, self.b2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            return torch.relu(self.b2(self.c2(y)) + x)

    m = Block().to(device=device, dtype=dtype).eval().requires_grad_(False)
    with torch.no_grad():
        for b in (m.b1, m.b2):
            b.running_mean.copy_(torch.randn(8) * 0.1)
            b.running_var.copy_(torch.rand(8) + 0.5)
    x = torch.randn(2, 8, 12, 12, device=device, dtype=dtype)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype != torch.float32 or device == "cuda" else dict(rtol=1e-4, atol=1e-5)
    out = check(m, x, **tol)
    assert out.stride() == m(x).stride()
    names = [k.name for k in kiln.explain(m)(x).kernels]
    assert any("channels_last" in n for n in names), names


def _layouts(n, c, h, w, device):
    """4-d tensors over every dim order, with size-1 dims and sliced (holey) strides: the cases
    torch's suggest_memory_format breaks ties in."""
    base = torch.randn(n, c, h, w, device=device)
    yield base
    for perm in [(0, 2, 3, 1), (0, 3, 2, 1), (1, 0, 2, 3), (0, 1, 3, 2), (2, 3, 0, 1)]:
        inv = [perm.index(i) for i in range(4)]
        yield base.permute(perm).contiguous().permute(inv)
    yield base.to(memory_format=torch.channels_last)[:, :, ::2, :]
    yield torch.randn(n, c, h, 2 * w, device=device).to(memory_format=torch.channels_last)[..., ::2]


@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (1, 3, 1, 1), (2, 1, 4, 4), (3, 4, 1, 5), (1, 1, 3, 3)], ids=str)
def test_convolution_and_pooling_results_have_eagers_strides(device, shape):
    n, c, h, w = shape
    for x in _layouts(n, c, h, w, device):
        for weight_cl in (False, True):
            wt = torch.randn(2, c, 1, 1, device=device)
            if weight_cl:
                wt = wt.to(memory_format=torch.channels_last)

            def f(x, wt):
                y = F.conv2d(x, wt)
                return y, torch.relu(y) * 2, F.max_pool2d(x, 1), F.adaptive_avg_pool2d(x, 1)

            tol = dict(rtol=2e-2, atol=2e-2) if device == "cuda" else {}
            out = check(f, x, wt, **tol)
            ref = f(x, wt)
            # Strides of dims of size 1 carry no layout (torch's TensorIterator and empty_like
            # disagree on them too): the others must be eager's.
            def layout(t):
                return [s for s, d in zip(t.stride(), t.shape) if d != 1]
            assert [layout(o) for o in out] == [layout(r) for r in ref], (x.stride(), weight_cl)


@pytest.mark.parametrize("padding,kernel,dilation", [("same", 3, 1), ("same", 5, 2), ("valid", 3, 1)])
def test_conv2d_module_with_string_padding(device, padding, kernel, dilation):
    # timm's convmixer: nn.Conv2d(padding="same") inside a Sequential
    model = nn.Sequential(nn.Conv2d(4, 6, kernel, padding=padding, dilation=dilation), nn.ReLU()).to(device).eval()
    with torch.no_grad():
        check(model, torch.randn(1, 4, 9, 9, device=device), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU, nn.RNN])
def test_recurrent_modules_are_one_graph_and_see_replaced_weights(cls):
    # torch's RNN modules test their weights' identity through weakrefs (_weights_have_changed):
    # a weakref call is its referent, guarded through the weakref's source
    m = cls(8, 16, num_layers=2, batch_first=True).eval()
    x = torch.randn(3, 5, 8)
    with torch.no_grad():
        e = kiln.explain(m)(x)
        assert e.graph_count == 1 and e.graph_break_count == 0, e.break_reasons
        f = kiln.compile(m)
        torch.testing.assert_close(f(x)[0], m(x)[0])
        old = m.weight_ih_l0  # kept alive, so its weakref still answers
        m.weight_ih_l0 = nn.Parameter(torch.randn_like(old))
        torch.testing.assert_close(f(x)[0], m(x)[0])
        del old
        m.weight_hh_l1 = nn.Parameter(torch.randn_like(m.weight_hh_l1))
        torch.testing.assert_close(f(x)[0], m(x)[0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_eval_batch_norm_in_16_bit_computes_its_scale_in_float(device, dtype):
    """torch's eval batch norm computes w * rsqrt(var + eps) and the shift in float for 16-bit
    tensors; in 16-bit they were one rounding off, 214 of 8192 values past 2e-2."""
    torch.manual_seed(0)
    x = (torch.randn(64, 2, 8, 8, device=device) * 5).to(dtype)
    rm, rv, w, b = ((torch.randn(2, device=device) * 5).to(dtype), (torch.rand(2, device=device) * 5).to(dtype),
                    (torch.randn(2, device=device) * 5).to(dtype), (torch.randn(2, device=device) * 5).to(dtype))
    check(lambda x, rm, rv, w, b: F.batch_norm(x, rm, rv, w, b, training=False, eps=0.5), x, rm, rv, w, b,
          rtol=1e-2, atol=1e-2)


def test_softmax2d_module_is_one_graph(device):
    """nn.Softmax2d calls F.softmax(..., _stacklevel=5): a keyword that only places warnings."""
    m = nn.Softmax2d()
    x = torch.randn(2, 3, 4, 5, device=device)
    check(m, x)
