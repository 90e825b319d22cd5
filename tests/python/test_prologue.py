"""The prologue: what an inference graph computes from parameters and buffers alone (a batch
norm folded into the convolution before it, a channels-last copy of a convolution's weight, a
weight cast under autocast) runs once, and again only when one of those tensors changes.

Each test compares with eager on fresh inputs, checks that kiln compiled (one graph, no
fallback) and counts prologue runs (kiln.stats()["prologue_runs"]) to show what was kept and
what was computed again."""
import copy
import re

import pytest
import torch

import kiln

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])]


class ConvBlock(torch.nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, c, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(c)
        self.conv2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=True)
        self.bn2 = torch.nn.BatchNorm2d(c)
        self.down = torch.nn.Conv2d(3, c, 1, bias=False)
        self.bn3 = torch.nn.BatchNorm2d(c)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.bn3(self.down(x)))


def _model(device):
    torch.manual_seed(0)
    m = ConvBlock().to(device).eval()
    with torch.no_grad():  # statistics and affine parameters unlike a fresh batch norm's
        for bn in (m.bn1, m.bn2, m.bn3):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
    return m


def _runs():
    return kiln.stats()["prologue_runs"]


def _close(a, b):
    # cuDNN runs float32 convolutions in TF32 by default (torch.backends.cudnn.allow_tf32): eager
    # rounds the weight to TF32, the folded convolution rounds the folded weight, 2^-11 apart
    # each, as inductor's folded convolutions are.
    tf32 = a.is_cuda and torch.backends.cudnn.allow_tf32
    torch.testing.assert_close(a, b, rtol=2e-3 if tf32 else 1e-4, atol=5e-3 if tf32 else 1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_batch_norm_folds_into_the_convolution_and_runs_once(device):
    m = _model(device)
    x = torch.randn(2, 3, 12, 12, device=device)
    with torch.no_grad():
        e = kiln.explain(m)(x)
    assert e.graph_count == 1 and e.graph_break_count == 0
    assert len(e.prologues) == 1, e
    # The main graph keeps the convolutions and no batch norm arithmetic: no rsqrt, no
    # per-channel scale over the activations.
    assert "conv2d" in e.graphs[0] and "rsqrt" not in e.graphs[0], e.graphs[0]
    assert "rsqrt" in e.prologues[0]["graph"]
    f = kiln.compile(m)
    before = _runs()
    fallbacks = kiln.stats()["eager_fallbacks"]
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 3, 12, 12, device=device)
            _close(f(x), m(x))
    assert _runs() - before == 1
    assert kiln.stats()["eager_fallbacks"] == fallbacks


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_changed_parameters_and_buffers_are_seen(device, mode):
    m = _model(device)
    f = kiln.compile(m, mode=mode)
    x = torch.randn(2, 3, 12, 12, device=device)
    with torch.no_grad():
        for _ in range(3):
            _close(f(x), m(x))
        runs = _runs()
        changes = [
            lambda: m.bn1.running_var.mul_(2.0),           # a buffer, in place
            lambda: m.conv2.weight.add_(0.25),              # a parameter, in place (an optimizer step)
            lambda: m.bn2.bias.copy_(torch.randn_like(m.bn2.bias)),
            lambda: m.load_state_dict(_model(device).state_dict() | {"bn3.running_mean": torch.randn(8, device=device)}),
            lambda: setattr(m.bn1, "weight", torch.nn.Parameter(torch.rand(8, device=device) + 0.5)),  # another tensor
            lambda: setattr(m.conv1.weight, "data", torch.randn_like(m.conv1.weight)),  # other memory
        ]
        for i, change in enumerate(changes):
            change()
            for _ in range(2):
                x = torch.randn(2, 3, 12, 12, device=device)
                _close(f(x), m(x))
            assert _runs() == runs + i + 1, f"change {i}"


def test_weights_passed_as_arguments_are_read_at_every_call():
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(4).eval()

    def fn(x, w):
        return bn(torch.nn.functional.conv2d(x, w, padding=1))

    x, w = torch.randn(1, 2, 6, 6), torch.randn(4, 2, 3, 3)
    with torch.no_grad():
        e = kiln.explain(fn)(x, w)
    # The batch norm's per-channel scale and shift come from its buffers alone and are kept;
    # the weight is the caller's: it is not folded, and is read at every call.
    assert e.graph_count == 1 and len(e.prologues) == 1
    assert "%w :" not in e.prologues[0]["graph"] and re.search(r"conv2d\(%\w+, %w,", e.graphs[0]), e
    f = kiln.compile(fn)
    with torch.no_grad():
        for _ in range(2):
            w = torch.randn(4, 2, 3, 3)
            _close(f(x, w), fn(x, w))
            w.mul_(3)
            _close(f(x, w), fn(x, w))


def test_a_value_made_of_parameters_alone_is_not_handed_out_from_the_cache():
    lin = torch.nn.Linear(4, 4)

    def fn(x):
        return x @ lin.weight.t() * 2, lin.weight * 2 + 1

    f = kiln.compile(fn)
    x = torch.randn(3, 4)
    with torch.no_grad():
        a, b = f(x)
        b.zero_()  # the caller owns what it gets
        a2, b2 = f(x)
        ea, eb = fn(x)
    _close(a2, ea)
    _close(b2, eb)


def test_training_mode_and_autograd_keep_batch_norm_as_it_is():
    m = _model("cpu")
    m.train()
    x = torch.randn(4, 3, 8, 8)
    e = kiln.explain(m)(x)  # runs the module: its running statistics move
    assert not e.prologues
    ref = copy.deepcopy(m)
    f = kiln.compile(m)
    _close(f(x), ref(x))
    _close(m.bn1.running_mean, ref.bn1.running_mean)
    # Eval mode with grad on: a training graph, whose parameters change at every step.
    m.eval()
    ref.eval()
    x = torch.randn(2, 3, 8, 8)
    out = f(x)
    _close(out, ref(x))
    out.sum().backward()
    ref(x).sum().backward()
    _close(m.conv1.weight.grad, ref.conv1.weight.grad)


def test_autocast_weight_casts_are_kept():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16)).eval()

    def fn(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return mlp(x)

    f = kiln.compile(fn)
    with torch.no_grad():
        x = torch.randn(8, 32)
        e = kiln.explain(fn)(x)
        assert e.graph_count == 1 and len(e.prologues) == 1, e
        runs = _runs()
        for _ in range(3):
            x = torch.randn(8, 32)
            out, ref = f(x), fn(x)
            assert out.dtype == ref.dtype == torch.bfloat16
            torch.testing.assert_close(out, ref, rtol=1.6e-2, atol=1e-2)
        assert _runs() == runs + 1
        mlp[0].weight.mul_(-1)
        x = torch.randn(8, 32)
        torch.testing.assert_close(f(x), fn(x), rtol=1.6e-2, atol=1e-2)
        assert _runs() == runs + 2


def test_cpu_convolutions_read_weights_prepacked_once_and_see_them_change():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2), torch.nn.ReLU(),
                              torch.nn.Conv2d(8, 4, 1)).eval()
    x = torch.randn(2, 3, 10, 10)
    with torch.no_grad():
        e = kiln.explain(net)(x)
    assert e.graph_count == 1
    assert e.graphs[0].count("conv2d_prepacked(") == 3, e.graphs[0]
    f = kiln.compile(net)
    with torch.no_grad():
        for i in range(4):
            x = torch.randn(2, 3, 10, 10)
            _close(f(x), net(x))
            if i == 1:
                net[0].weight.mul_(-2)         # in place: a new version
            if i == 2:
                net[2].weight = torch.nn.Parameter(torch.randn_like(net[2].weight))  # another tensor
        x = torch.randn(3, 3, 10, 10)           # another batch: packed for its input sizes
        _close(f(x), net(x))


class _GatheredBufferEmbedding(torch.nn.Module):
    """BERT's token-type ids: a torch.gather over buffers alone, then an embedding of them."""

    def __init__(self):
        super().__init__()
        self.register_buffer("ids", torch.tensor([3, 1, 4, 1, 5, 9, 2, 6]))
        self.register_buffer("pos", torch.arange(6))
        self.emb = torch.nn.Embedding(10, 4)

    def forward(self, x):
        idx = torch.gather(self.ids.expand(2, -1), 1, self.pos.expand(2, -1))
        return self.emb(idx) + x


def test_a_deterministic_torch_call_of_buffers_runs_once_and_sees_them_change():
    torch.manual_seed(0)
    m = _GatheredBufferEmbedding().eval()
    x = torch.randn(2, 6, 4)
    with torch.no_grad():
        e = kiln.explain(m)(x)
        assert e.graph_count == 1 and len(e.prologues) == 1, e
        assert "gather" in e.prologues[0]["graph"] and "gather" not in e.graphs[0], e.graphs[0]
        cm = kiln.compile(m)
        torch.testing.assert_close(cm(x), m(x))
        runs = kiln.stats()["prologue_runs"]
        torch.testing.assert_close(cm(x + 1), m(x + 1))
        assert kiln.stats()["prologue_runs"] == runs, "the prologue ran again with nothing changed"
        m.ids.copy_(torch.tensor([0, 2, 4, 6, 8, 1, 3, 5]))  # an in-place update of the buffer
        torch.testing.assert_close(cm(x), m(x))
        m.emb.weight.mul_(2)
        torch.testing.assert_close(cm(x), m(x))


def test_a_seeded_random_torch_call_of_buffers_stays_in_the_main_graph():
    class Noisy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mean", torch.zeros(3))
            self.register_buffer("std", torch.ones(3))

        def forward(self, x):
            return x + torch.normal(self.mean, self.std)

    m = Noisy()
    x = torch.randn(3)
    with torch.no_grad():
        e = kiln.explain(m)(x)
        assert not any("normal" in p["graph"] for p in e.prologues), e.prologues
        cm = kiln.compile(m)
        a, b = cm(x), cm(x)
        assert not torch.equal(a, b), "a random draw was computed once and reused"
