"""float16 and bfloat16 kernels (issue 12, part 1): graphs over 16-bit floats compile into kiln's
own kernels on both devices, never into calls of torch's ops. Elements are 16-bit in memory and
float in registers: loads convert, stores round to nearest even, a 16-bit value fused into a
later op is rounded as eager's store between the ops would round it, and reductions, softmax,
mean and the norms accumulate in float and round once, as torch's kernels do.

Each test compares with eager on fresh random inputs and also requires that the graph compiled
to kernels whose source reads or writes a 16-bit buffer (``kiln_half`` / ``kiln_bf16``)."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from _helpers import assert_same, check

HALF = [torch.float16, torch.bfloat16]
CTYPE = {torch.float16: "kiln_half", torch.bfloat16: "kiln_bf16"}
# torch.testing's defaults, a little wider where kiln and torch round one op's float result
# from different (equally good) float computations (transcendentals, reduction order).
TOL = {torch.float16: (2e-3, 1e-3), torch.bfloat16: (1.6e-2, 1e-2)}


def _kernels_over(fn, args, dtype):
    """The kernels kiln generated for fn(*args); fails if none touches a 16-bit buffer."""
    explained = kiln.explain(fn)(*args)
    assert not explained.break_reasons, explained.break_reasons
    assert explained.kernels, f"no kernels generated:\n{explained}"
    source = "".join(k.source for k in explained.kernels)
    assert CTYPE[dtype] in source, f"no kernel reads or writes {dtype}:\n{source}"
    return explained


def _check(fn, *args, dtype, rtol=None, atol=None):
    _kernels_over(fn, args, dtype)
    r, a = TOL[dtype]
    return check(fn, *args, rtol=rtol or r, atol=atol or a)


POINTWISE = {
    "add_mul": lambda x, y: x * y + x,
    "gelu_tanh": lambda x, y: F.gelu(x, approximate="tanh") + y,
    "gelu_erf": lambda x, y: F.gelu(x) * y,
    "silu_gate": lambda x, y: F.silu(x) * y,
    "exp_log": lambda x, y: torch.exp(x) - torch.log1p(y.abs()),
    "sigmoid_where": lambda x, y: torch.where(x > y, torch.sigmoid(x), y),
    "div_sqrt": lambda x, y: x / torch.sqrt(y.abs() + 1),
    "clamp_relu": lambda x, y: torch.clamp(torch.relu(x), max=1.0) - y,
    "scalar_ops": lambda x, y: (x + 3.5) * 0.125 - y / 7,
    "pow_tanh": lambda x, y: torch.tanh(x) ** 2 + y,
}


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("name", sorted(POINTWISE))
def test_pointwise_chains(device, dtype, name):
    x = torch.randn(37, 65, device=device).to(dtype)
    y = torch.randn(65, device=device).to(dtype)  # broadcast
    _check(POINTWISE[name], x, y, dtype=dtype)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("layout", ["transposed", "sliced", "expanded", "0d", "empty"])
def test_layouts(device, dtype, layout):
    base = torch.randn(24, 40, device=device).to(dtype)
    x = {"transposed": base.t(), "sliced": base[3:, 1::2], "expanded": base[:1].expand(24, 40),
         "0d": base[0, 0].clone(), "empty": base[:0]}[layout]
    fn = lambda t: torch.sigmoid(t) * 2 - t  # noqa: E731
    if layout == "empty":
        check(fn, x)  # nothing to compute: no kernel required
    else:
        _check(fn, x, dtype=dtype)


REDUCTIONS = {
    "sum": lambda x: x.sum(-1),
    "sum_dim0_keepdim": lambda x: x.sum(0, keepdim=True) * 2,
    "mean": lambda x: x.mean(-1),
    "amax_amin": lambda x: x.amax(1) - x.amin(1),
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: torch.log_softmax(x * 3, 0),
    "var_like": lambda x: ((x - x.mean(-1, keepdim=True)) ** 2).mean(-1),
    "full_sum": lambda x: x.sum(),
}


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reductions_accumulate_in_float(device, dtype, name):
    x = torch.randn(48, 300, device=device).to(dtype)
    _check(REDUCTIONS[name], x, dtype=dtype, rtol=2e-2 if dtype == torch.bfloat16 else 4e-3, atol=2e-2)


def test_a_long_sum_accumulates_in_float(device):
    # 4096 ones summed in bfloat16 would stop at 256; accumulated in float it is exact.
    x = torch.ones(4096, device=device, dtype=torch.bfloat16)
    fn = lambda t: (t * 1).sum()  # noqa: E731
    _kernels_over(fn, (x,), torch.bfloat16)
    assert kiln.compile(fn)(x).item() == fn(x).item() == 4096


@pytest.mark.parametrize("dtype", HALF)
def test_norms(device, dtype):
    torch.manual_seed(0)
    ln = torch.nn.LayerNorm(64).to(device=device, dtype=dtype)
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()
    w = torch.randn(64, device=device).to(dtype)
    x = torch.randn(6, 10, 64, device=device).to(dtype)

    def fn(t):
        return ln(t) + F.rms_norm(t, (64,), w, 1e-6)

    with torch.no_grad():
        _check(fn, x, dtype=dtype, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", HALF)
def test_mixed_dtypes(device, dtype):
    x = torch.randn(16, 32, device=device).to(dtype)
    y = torch.randn(16, 32, device=device)

    def fn(a, b):
        wide = a + b                 # promotes to float32
        narrow = b.to(dtype) * a     # float32 -> 16-bit, rounded before the multiply
        return wide, narrow, narrow.float() - b, a.double().sum(0)

    _check(fn, x, y, dtype=dtype)


def test_float16_and_bfloat16_together(device):
    a = torch.randn(8, 16, device=device).half()
    b = torch.randn(8, 16, device=device).bfloat16()
    _check(lambda x, y: (x * y, x.bfloat16() + y, y.half() - x), a, b, dtype=torch.float16)


@pytest.mark.parametrize("dtype", HALF)
def test_conversions_round_as_torch_does(device, dtype):
    """Exact, bit for bit: ties to even, overflow to inf, subnormals, inf, nan, signed zeros."""
    info = torch.finfo(dtype)
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), info.max, -info.max,
                            info.max * 1.0009765625, info.tiny, info.tiny / 3, info.smallest_normal * 0.5,
                            1e-30, -1e-30, 3e38, 1 / 3, 2 / 3], device=device)
    # float32 values at and around the midpoints between neighbouring 16-bit values
    grid = torch.randn(4096, device=device).to(dtype).float()
    ulp = torch.nextafter(grid.to(dtype), torch.full_like(grid, float("inf")).to(dtype)).float() - grid
    mid = grid + ulp / 2
    near = torch.cat([mid, torch.nextafter(mid, mid + 1), torch.nextafter(mid, mid - 1), special])

    fn = lambda t: (t.to(dtype), (t * 1).to(dtype).float())  # noqa: E731
    _kernels_over(fn, (near,), dtype)
    actual, expected = kiln.compile(fn)(near), fn(near)
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype
        same = (a.float().view(torch.int32) == e.float().view(torch.int32)) | (a.isnan() & e.isnan())
        assert bool(same.all()), (near[~same], a[~same], e[~same])


@pytest.mark.parametrize("dtype", HALF)
def test_every_16_bit_value_converts_exactly(device, dtype):
    """All 65536 bit patterns: read as float (the load conversion), the midpoints to their
    neighbours and one float32 ulp either side rounded back (the store conversion), and the
    rounding of a 16-bit value fused into a float32 result."""
    bits = torch.arange(-32768, 32768, dtype=torch.int32, device=device).to(torch.int16)
    h = bits.view(dtype)
    up = torch.nextafter(h, torch.full_like(h, float("inf"))).float()
    mid = (h.float() + (up - h.float()) / 2)[h.isfinite() & up.isfinite()]
    near = torch.cat([mid, torch.nextafter(mid, mid + 1), torch.nextafter(mid, mid - 1)])

    def fn(x, f):
        return x.float() * 1, f.to(dtype), (f * 1).to(dtype).float() + 0

    _kernels_over(fn, (h, near), dtype)
    actual, expected = kiln.compile(fn)(h, near), fn(h, near)
    for a, e in zip(actual, expected):
        same = (a.float().view(torch.int32) == e.float().view(torch.int32)) | (a.isnan() & e.isnan())
        assert bool(same.all()), (a[~same][:8], e[~same][:8])


@pytest.mark.parametrize("dtype", HALF)
def test_intermediate_16_bit_values_are_rounded(device, dtype):
    # (x * 3) is stored in 16 bits between eager's ops; fused, kiln rounds it the same way.
    x = torch.randn(4096, device=device).to(dtype)

    def fn(t):
        return (t * 3) - t * 3.0000001

    _kernels_over(fn, (x,), dtype)
    torch.testing.assert_close(kiln.compile(fn)(x), fn(x), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", HALF)
def test_mlp_in_16_bits(device, dtype):
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64),
                              torch.nn.LayerNorm(64)).to(device=device, dtype=dtype).eval()
    x = torch.randn(8, 64, device=device).to(dtype)
    with torch.no_grad():
        _check(mlp, x, dtype=dtype, rtol=3e-2, atol=3e-2)


class _Block(torch.nn.Module):
    """A pre-norm transformer block: attention (matmul, scale, mask, softmax, matmul) and an MLP."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.up, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = torch.softmax(att.masked_fill(~mask, float("-inf")), -1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(B, T, C))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


@pytest.mark.parametrize("dtype", HALF)
def test_transformer_block_under_autocast_compiles_to_16_bit_kernels(device, dtype):
    if device == "cpu" and dtype == torch.float16:
        pytest.skip("CPU autocast takes bfloat16 (float16 is CUDA's)")
    torch.manual_seed(0)
    block = _Block().to(device).eval()
    x = torch.randn(2, 12, 64, device=device)
    cf = kiln.compile(block)
    with torch.no_grad(), torch.autocast(device, dtype=dtype):
        explained = kiln.explain(block)(x)
        expected = block(x)
        before = kiln.stats()["eager_fallbacks"]
        actual = cf(x)
        assert kiln.stats()["eager_fallbacks"] == before
    assert not explained.break_reasons, explained.break_reasons
    assert explained.graph_count == 1
    assert any(CTYPE[dtype] in k.source for k in explained.kernels)
    assert not actual.isnan().any()
    assert_same(actual, expected, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("dtype", HALF)
def test_transformer_block_in_16_bits(device, dtype):
    torch.manual_seed(0)
    block = _Block().to(device=device, dtype=dtype).eval()
    x = torch.randn(2, 12, 64, device=device).to(dtype)
    with torch.no_grad():
        _check(block, x, dtype=dtype, rtol=5e-2, atol=5e-2)


def test_a_16_bit_graph_is_no_fallback_reason():
    kiln.reset()
    x = torch.randn(32, dtype=torch.bfloat16)
    kiln.compile(lambda t: t.exp() + 1)(x)
    assert not any("16-bit" in r for r in kiln.stats()["fallback_reasons"]), kiln.stats()["fallback_reasons"]


@pytest.mark.parametrize("dtype", HALF)
def test_dynamic_shapes_over_16_bit_kernels(device, dtype):
    fn = lambda t: torch.softmax(t * 2, -1) + t  # noqa: E731
    cf = kiln.compile(fn, dynamic=True)
    for n in (5, 17, 64):
        x = torch.randn(3, n, device=device).to(dtype)
        assert_same(cf(x), fn(x), rtol=2e-2, atol=2e-2)
    assert kiln.explain(cf)(x).kernels


@pytest.mark.parametrize("dtype", HALF)
def test_through_an_integer_and_back_as_eager(device, dtype):
    # 16-bit -> int32 -> 16-bit (fuzzer seed 50065 with --half): inf, nan and -0.0 go through the
    # integer as x86 converts them, not folded into a trunc() that keeps them.
    x = torch.tensor([-0.0, -0.25, float("inf"), float("-inf"), float("nan"), 2.5, -3.5, 0.75],
                     device=device).to(dtype)
    fn = lambda t: (t.int() * t.clamp_min(0.5), t.long().to(dtype))  # noqa: E731
    _kernels_over(fn, (x,), dtype)
    actual, expected = kiln.compile(fn)(x), fn(x)
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype
        same = (a == e) | (a.isnan() & e.isnan())
        assert bool(same.all()) and torch.equal(a.signbit(), e.signbit()), (a, e)


@pytest.mark.parametrize("dtype", HALF)
def test_square_root_powers_as_torchs_cpu_kernel(dtype):
    # torch's CPU pow takes x ** 0.5 as sqrt for bfloat16 but as pow for float16, which differ at
    # -inf and -0.0 (fuzzer seed 70885 with --half); kiln follows each.
    x = torch.tensor([float("-inf"), -0.0, 0.0, 4.0, -1.0, 3.0, float("inf"), 0.25] * 3).to(dtype)
    for fn in (lambda t: t ** 0.5, lambda t: t ** -0.5, lambda t: torch.pow(t * 1, 0.5) + 1):
        _kernels_over(fn, (x,), dtype)
        a, e = kiln.compile(fn)(x), fn(x)
        same = (a == e) | (a.isnan() & e.isnan())
        assert bool(same.all()), (a, e)
        assert torch.equal(a.signbit() | a.isnan(), e.signbit() | e.isnan()), (a, e)


@pytest.mark.parametrize("dtype", HALF)
def test_python_numbers_in_16_bit_ops_as_torchs_cpu_kernels(dtype):
    # torch's CPU kernels round a Python number (or a 0-d float64 tensor) in a 16-bit op to the
    # 16-bit type first (x + 0.1 adds 0.0999755859375 in float16), except mul, div and
    # floor_divide, which read it at full precision: kiln does the same, bit for bit.
    torch.manual_seed(0)
    x = (torch.randn(4096) * 3).to(dtype)
    s64 = torch.tensor(0.1, dtype=torch.float64)
    fns = [lambda t: t + 0.1, lambda t: t - 0.1, lambda t: 0.3 - t, lambda t: t % 0.1, lambda t: t * 0.1,
           lambda t: t / 0.1, lambda t: t // 0.1, lambda t: t < 0.1, lambda t: torch.clamp(t, max=0.1),
           lambda t: t + s64, lambda t: s64 - t, lambda t: t * s64]
    for fn in fns:
        _kernels_over(fn, (x,), dtype)
        a, e = kiln.compile(fn)(x), fn(x)
        assert a.dtype == e.dtype and torch.equal(a, e), int((a != e).sum())
