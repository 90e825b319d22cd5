"""torch.rand, randn and randint (and their _like forms) inside a graph (issue 15, part 3): kiln
draws them in its kernels from a counter-based generator keyed by a seed the runtime takes from
torch's default generator at each call, so results are reproducible under torch.manual_seed and
have torch's distributions, but are not the values torch's own kernels would draw (documented in
docs/architecture.md). Tests check the distributions statistically (bounds many standard errors
wide), reproducibility, eager's dtypes, shapes, devices and errors, and that no graph breaks."""
import math

import pytest
import torch

import kiln

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])]


def _one_graph(fn, *args):
    e = kiln.explain(fn)(*args)
    assert e.graph_count == 1 and not e.break_reasons, e.break_reasons


@pytest.mark.parametrize("device", DEVICES)
def test_draws_have_torchs_distributions(device):
    def f(x):
        return (torch.rand(512, 256, device=device), torch.randn_like(x), torch.randint(3, 10, (512, 256), device=device),
                torch.randint_like(x, 5), torch.rand_like(x, dtype=torch.float64), torch.randn(x.shape[0], 7, dtype=torch.float64, device=device))
    x = torch.randn(512, 256, device=device)
    _one_graph(f, x)
    u, z, i, j, u64, z64 = kiln.compile(f)(x)
    n = u.numel()
    for v in (u, u64):
        assert 0 <= v.min() and v.max() < 1
        assert abs(v.mean().item() - 0.5) < 6 * math.sqrt(1 / 12 / n)
        s = torch.sort(v.flatten().double().cpu()).values  # Kolmogorov-Smirnov against U[0, 1)
        assert (s - torch.arange(1, n + 1, dtype=torch.float64) / n).abs().max() < 2.5 / math.sqrt(n)
    for v in (z, z64):
        m = v.numel()
        assert abs(v.mean().item()) < 6 / math.sqrt(m) and abs(v.var().item() - 1) < 6 * math.sqrt(2 / m)
        assert abs((v.abs() > 2).double().mean().item() - 0.0455) < 6 * math.sqrt(0.0455 / m)
    assert i.dtype == torch.int64 and j.dtype == x.dtype and u64.dtype == torch.float64 and z64.shape == (512, 7)
    counts = torch.bincount(i.flatten().cpu(), minlength=10)[3:].double() / n
    assert counts.numel() == 7 and (counts - 1 / 7).abs().max() < 6 * math.sqrt(1 / 7 / n)
    assert set(j.unique().tolist()) == {0.0, 1.0, 2.0, 3.0, 4.0}
    assert all(t.device == x.device for t in (u, z, i, j, u64, z64))


@pytest.mark.parametrize("device", DEVICES)
def test_draws_repeat_under_manual_seed_and_differ_between_calls(device):
    def f(x):
        return x + torch.randn(x.shape, device=device), torch.rand(3, device=device)
    c = kiln.compile(f)
    x = torch.zeros(64, 8, device=device)
    torch.manual_seed(1)
    a = c(x)
    torch.manual_seed(1)
    b = c(x)
    d = c(x)
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    assert not torch.equal(a[0], d[0]) and not torch.equal(a[1], d[1])
    # two draws of one call are independent
    g = kiln.compile(lambda x: (torch.rand_like(x), torch.rand_like(x)))
    p, q = g(x)
    assert not torch.equal(p, q) and abs(torch.corrcoef(torch.stack([p.flatten(), q.flatten()]))[0, 1].item()) < 0.2


def test_symbolic_sizes_and_the_default_dtype():
    def f(x):
        return torch.rand(x.shape[0], 2) + x.sum(), torch.randn(x.shape)
    c = kiln.compile(f, dynamic=True)
    for n in (5, 9, 17):
        a, b = c(torch.ones(n))
        assert a.shape == (n, 2) and b.shape == (n,) and a.dtype == torch.float32
    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        assert c(torch.ones(5, dtype=torch.float64))[1].dtype == torch.float64
    finally:
        torch.set_default_dtype(old)


@pytest.mark.parametrize("call", [
    lambda x: torch.randint(5, 5, (3,)),                 # an empty range
    lambda x: torch.rand(3, dtype=torch.int64),          # rand of an integer type
    lambda x: torch.randn(-1, 2),                        # a negative size
    lambda x: torch.randint_like(x, 0),
])
def test_eagers_errors(call):
    x = torch.zeros(3)
    with pytest.raises(RuntimeError) as expected:
        call(x)
    with pytest.raises(type(expected.value)):
        kiln.compile(call)(x)


def test_a_generator_of_ones_own_is_torchs_draw():
    def f(x, g):
        return x + torch.rand(4, generator=g)
    x = torch.zeros(4)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    torch.testing.assert_close(kiln.compile(f)(x, g1), f(x, g2), rtol=0, atol=0)


def test_reparameterization_gradients():
    # a VAE's z = mu + eps * exp(logvar / 2): gradients flow to mu and logvar, not through eps
    def f(mu, logvar):
        eps = torch.randn_like(mu)
        return mu + eps * torch.exp(0.5 * logvar), eps
    mu, logvar = torch.randn(32, 4, requires_grad=True), torch.randn(32, 4, requires_grad=True)
    _one_graph(f, mu, logvar)
    z, eps = kiln.compile(f)(mu, logvar)
    z.sum().backward()
    torch.testing.assert_close(mu.grad, torch.ones_like(mu))
    torch.testing.assert_close(logvar.grad, (eps * 0.5 * torch.exp(0.5 * logvar)).detach())


def test_the_eager_backend_draws_with_torch():
    # backend="eager" runs the graph through torch's own draws (after the call's seed draw)
    f = lambda x: x + torch.rand(4) + torch.randn_like(x) + torch.randint(0, 3, (4,))  # noqa: E731
    c = kiln.compile(f, backend="eager")
    x = torch.zeros(4)
    torch.manual_seed(5)
    a = c(x)
    torch.manual_seed(5)
    torch.testing.assert_close(c(x), a, rtol=0, atol=0)
    assert a.dtype == torch.float32 and a.shape == (4,) and not torch.equal(a, c(x))


@pytest.mark.parametrize("device", DEVICES)
def test_bernoulli_masks_of_stochastic_depth(device):
    # torchvision's StochasticDepth and timm's DropPath: empty(...).bernoulli_(keep), then scaled
    def drop_path(x, keep=0.7):
        mask = x.new_empty((x.shape[0], 1, 1)).bernoulli_(keep)
        return x * mask.div_(keep), torch.bernoulli(torch.full_like(x, 0.25))
    x = torch.ones(4096, 2, 3, device=device)
    _one_graph(drop_path, x)
    y, b = kiln.compile(drop_path)(x)
    kept = (y[:, 0, 0] != 0).double()
    assert all(v == 0 or abs(v - 1 / 0.7) < 1e-6 for v in y.unique().tolist())
    assert abs(kept.mean().item() - 0.7) < 6 * math.sqrt(0.21 / 4096)
    assert (y == y[:, :1, :1]).all()  # one draw per sample
    assert set(b.unique().tolist()) <= {0.0, 1.0} and abs(b.mean().item() - 0.25) < 6 * math.sqrt(0.1875 / b.numel())
