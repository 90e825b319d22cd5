"""Training (issue 13): a call whose results autograd tracks compiles a forward program and a
backward program (the joint graph, partitioned), tied together by kiln's autograd node.

Every test here checks that kiln compiled the backward (kiln.stats()'s
``backward_graphs_compiled`` grows, no eager fallback), then compares results and gradients
with eager autograd on fresh random inputs.
"""
import copy
import re

import pytest
import torch
import torch.nn.functional as F

import kiln


def _counters():
    s = kiln.stats()
    return s["backward_graphs_compiled"], s["eager_fallbacks"], s["graph_breaks"]


def _leaves(args, dtype=None):
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            b = a.detach().clone()
            if dtype is not None and b.is_floating_point():
                b = b.to(dtype)
            out.append(b.requires_grad_(a.requires_grad))
        else:
            out.append(a)
    return out


def _tensors(out):
    return [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]


def grads_match(fn, *args, rtol=None, atol=None, compiled=None):
    """fn compiled with a backward program (no fallback, no break): its results, their
    requires_grad, and the gradients of every input that requires grad under a random tangent
    equal eager's."""
    compiled = compiled or kiln.compile(fn)
    mine, theirs = _leaves(args), _leaves(args)
    before = _counters()
    got = compiled(*mine)
    after = _counters()
    assert after[0] == before[0] + 1, "no backward program was compiled"
    assert after[1:] == before[1:], kiln.stats()["fallback_reasons"]
    want = fn(*theirs)
    got_t, want_t = _tensors(got), _tensors(want)
    assert len(got_t) == len(want_t)
    for g, w in zip(got_t, want_t):
        assert g.requires_grad == w.requires_grad
        torch.testing.assert_close(g.detach(), w.detach(), rtol=rtol, atol=atol)
    outs = [(g, w) for g, w in zip(got_t, want_t) if w.requires_grad]
    tangents = [torch.randn_like(w) for _, w in outs]
    wrt_mine = [a for a in mine if isinstance(a, torch.Tensor) and a.requires_grad]
    wrt_theirs = [a for a in theirs if isinstance(a, torch.Tensor) and a.requires_grad]
    gm = torch.autograd.grad([g for g, _ in outs], wrt_mine, tangents, allow_unused=True)
    gt = torch.autograd.grad([w for _, w in outs], wrt_theirs, tangents, allow_unused=True)
    for a, b in zip(gm, gt):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol)
    return got


def rand(*sizes, grad=True, dtype=torch.float64, low=None):
    t = torch.randn(*sizes, dtype=dtype)
    if low is not None:
        t = t.abs() + low
    return t.requires_grad_(grad)


# --- every op with a derivative, against eager autograd ----------------------------------------

UNARY = {
    "abs": torch.abs, "ceil": torch.ceil, "cos": torch.cos, "erf": torch.erf, "exp": torch.exp,
    "exp2": torch.exp2, "expm1": torch.expm1, "floor": torch.floor, "neg": torch.neg,
    "reciprocal": torch.reciprocal, "relu": torch.relu, "sigmoid": torch.sigmoid, "sin": torch.sin,
    "tan": torch.tan, "tanh": torch.tanh, "trunc": torch.trunc, "elu": F.elu, "gelu": F.gelu,
    "hardsigmoid": F.hardsigmoid, "hardswish": F.hardswish, "leaky_relu": F.leaky_relu,
    "silu": F.silu, "softplus": F.softplus, "clone": torch.clone,
    "hardtanh": lambda x: F.hardtanh(x, -0.5, 0.7), "relu6": lambda x: F.relu6(x * 8),
    "contiguous": lambda x: x.t().contiguous().t(),
}
POSITIVE = {"log": lambda x: torch.log(x), "log1p": lambda x: torch.log1p(x), "log2": lambda x: torch.log2(x),
            "rsqrt": lambda x: torch.rsqrt(x), "sqrt": lambda x: torch.sqrt(x)}
BINARY = {
    "add": lambda a, b: torch.add(a, b, alpha=0.5), "sub": lambda a, b: torch.sub(a, b, alpha=2),
    "mul": lambda a, b: torch.mul(a, b), "div": lambda a, b: torch.div(a, b),
    "maximum": lambda a, b: torch.maximum(a, b), "minimum": lambda a, b: torch.minimum(a, b),
    "where": lambda a, b: torch.where(a > b, a, b),
    "remainder": lambda a, b: torch.remainder(a, b.abs() + 0.5),
}
def _scaled_without_history(a):  # an in-place op under no_grad: eager keeps y's history
    y = a * 2
    with torch.no_grad():
        y.mul_(2)
    return y * a


class _CubeFunction(torch.autograd.Function):  # custom_vjp: an autograd.Function's own backward
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * x * x * g


OTHERS = {
    "custom_vjp": lambda: grads_match(lambda a, b: _CubeFunction.apply(a * b).sin(), rand(3, 4), rand(4)),
    "pow": lambda: grads_match(lambda a, b: a.abs().add(0.5) ** b + a ** 2, rand(3, 4), rand(4)),
    "convert": lambda: grads_match(lambda a: a.to(torch.float32).sin(), rand(3, 4)),
    "sum": lambda: grads_match(lambda a: (a.sum(1, keepdim=True) * a).sum(0), rand(3, 4)),
    "amax": lambda: grads_match(lambda a: a.amax(1) + a.round().amax(0).sum(), rand(3, 4)),
    "amin": lambda: grads_match(lambda a: a.amin((0, 1), keepdim=True) * a, rand(3, 4)),
    "mm": lambda: grads_match(lambda a, b: a @ b, rand(3, 4), rand(4, 5)),
    "bmm": lambda: grads_match(lambda a, b: torch.bmm(a, b), rand(2, 3, 4), rand(2, 4, 5)),
    "addmm": lambda: grads_match(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2), rand(5), rand(3, 4), rand(4, 5)),
    "alias": lambda: grads_match(lambda a: torch.ops.aten.alias.default(a) * 2, rand(3)),
    "grad_passthrough": lambda: grads_match(_scaled_without_history, rand(3, 4)),
    "expand": lambda: grads_match(lambda a: a.expand(4, 3, 2) * 2, rand(3, 1)),
    "permute": lambda: grads_match(lambda a: a.permute(2, 0, 1).exp(), rand(2, 3, 4)),
    "reshape": lambda: grads_match(lambda a: a.t().reshape(12).sin(), rand(3, 4)),
    "view": lambda: grads_match(lambda a: a.view(2, 6).sin(), rand(3, 4)),
    "select": lambda: grads_match(lambda a: a.select(1, 2).sin(), rand(3, 4)),
    "slice": lambda: (grads_match(lambda a: a[:, 1:3].sin() + a[1:].sum(), rand(3, 4)),
                      grads_match(lambda a: a[:, 1::2].sin() * a[::3, :3].sum(0) + a[1:6:4, :5:2].exp().sum(), rand(7, 6))),
    "squeeze": lambda: grads_match(lambda a: a.squeeze(1).sin(), rand(3, 1, 4)),
    "unsqueeze": lambda: grads_match(lambda a: a.unsqueeze(1).sin(), rand(3, 4)),
    "transpose": lambda: grads_match(lambda a: a.transpose(0, 1).sin(), rand(3, 4)),
    "cat": lambda: grads_match(lambda a, b: torch.cat([a, b, a], 1).sin(), rand(3, 2), rand(3, 4)),
    "conv2d": lambda: grads_match(lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1), rand(2, 3, 8, 8), rand(4, 3, 3, 3), rand(4)),
    "max_pool2d": lambda: grads_match(lambda x: F.max_pool2d(x, 3, 2, 1), rand(2, 3, 8, 8)),
    "adaptive_avg_pool2d": lambda: grads_match(lambda x: F.adaptive_avg_pool2d(x, 3), rand(2, 3, 7, 7)),
    "embedding_lookup": lambda: grads_match(lambda i, w: F.embedding(i, w, padding_idx=1), torch.randint(0, 6, (3, 4)), rand(6, 5)),
    "scaled_dot_product_attention": lambda: grads_match(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), rand(2, 3, 5, 8), rand(2, 3, 5, 8), rand(2, 3, 5, 8)),
    "torch_call": lambda: grads_match(lambda x: x.cumsum(1) + x[[0, 2]].sum(0), rand(3, 4)),
    # at the bounds themselves too, where torch 2.11 passes the gradient and 2.14 does not
    "clamp": lambda: grads_match(lambda x: x.clamp(-0.5, 0.5) * x + x.clamp(min=0) + x.clamp(max=0.5),
                                 torch.tensor([-1.0, -0.5, 0.0, 0.25, 0.5, 1.0], dtype=torch.float64).requires_grad_()),
    "channels_last": lambda: grads_match(lambda x, w: F.conv2d(x.to(memory_format=torch.channels_last), w).relu(),
                                         rand(1, 3, 6, 6), rand(4, 3, 3, 3)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_gradient(name):
    f = UNARY[name]
    grads_match(lambda x: f(x) * x, rand(3, 4))


@pytest.mark.parametrize("name", sorted(POSITIVE))
def test_positive_domain_gradient(name):
    grads_match(POSITIVE[name], rand(3, 4, low=0.1))


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_gradient_with_broadcasting(name):
    f = BINARY[name]
    grads_match(f, rand(3, 4), rand(4))
    grads_match(lambda a, b: f(a, b) * 3, rand(2, 1, 4), rand(3, 1, dtype=torch.float64))


@pytest.mark.parametrize("name", sorted(OTHERS))
def test_op_gradient(name):
    OTHERS[name]()


def test_every_op_with_a_derivative_has_a_gradient_test():
    with_derivative = {o["name"] for o in kiln._C.ops() if o["derivative"]}
    tested = set(UNARY) | set(POSITIVE) | set(BINARY) | set(OTHERS)
    assert with_derivative <= tested, sorted(with_derivative - tested)


def test_composites_through_their_decompositions():
    grads_match(lambda x, w, b: F.layer_norm(x, (5,), w, b), rand(3, 5), rand(5), rand(5))
    grads_match(lambda x: F.softmax(x, -1) + F.log_softmax(x, 0), rand(3, 5))
    grads_match(lambda x, w, b: F.linear(x, w, b).tanh(), rand(2, 3, 5), rand(4, 5), rand(4))
    grads_match(lambda x: x.clamp(-0.5, 0.5) + x.mean((0, 1)), rand(3, 5))
    grads_match(lambda x, w: F.rms_norm(x, (5,), w, eps=1e-6), rand(3, 5), rand(5))
    grads_match(lambda x, t: F.cross_entropy(x, t), rand(4, 5), torch.randint(0, 5, (4,)))
    grads_match(lambda x, y: F.mse_loss(x, y), rand(4, 5), rand(4, 5, grad=False))


# --- the runtime: autograd semantics -----------------------------------------------------------

def test_results_and_inputs_that_do_not_need_grad():
    # integer results, results no grad input reaches, and an input handed back as it is
    out = grads_match(lambda x, c: (x.exp(), x.argmax(1), c * 2, x), rand(3, 4), rand(3, 4, grad=False))
    assert not out[1].requires_grad and not out[2].requires_grad and out[3].requires_grad


def test_no_grad_blocks_and_detach_stop_gradients_as_in_eager():
    def f(x, w):
        with torch.no_grad():
            s = (x * w).sum()
        return x * s + w * x.detach()

    grads_match(f, rand(3), rand(3))


def test_backward_twice_needs_retain_graph_as_in_eager():
    cf = kiln.compile(lambda x: (x.sin() * x).sum())
    x = rand(4)
    cf(x).backward()
    y = cf(x)
    y.backward(retain_graph=True)
    y.backward()
    torch.testing.assert_close(x.grad, 3 * (x.cos() * x + x.sin()).detach())
    y = cf(x)
    y.backward()
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        y.backward()


def test_gradients_accumulate_into_grad_and_autograd_grad_leaves_it_alone():
    w = rand(3)
    cf = kiln.compile(lambda x, w: (x * w).sum())
    x1, x2 = rand(3, grad=False), rand(3, grad=False)
    cf(x1, w).backward()
    cf(x2, w).backward()
    torch.testing.assert_close(w.grad, x1 + x2)
    (g,) = torch.autograd.grad(cf(x1, w), [w])
    torch.testing.assert_close(g, x1)
    torch.testing.assert_close(w.grad, x1 + x2)


def test_double_backward_raises_a_clear_error():
    cf = kiln.compile(lambda x: (x ** 3).sum())
    x = rand(3)
    (g,) = torch.autograd.grad(cf(x), [x], create_graph=True)
    torch.testing.assert_close(g, 3 * x.detach() ** 2)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(g.sum(), [x])


def test_a_saved_input_updated_in_place_raises_eagers_error():
    cf = kiln.compile(lambda x, w: (x * w).sum())
    x, w = rand(3), rand(3)
    y = cf(x, w)
    with torch.no_grad():
        w.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_requires_grad_is_guarded():
    cf = kiln.compile(lambda a, b: (a * b).sin())
    a, b = rand(3), rand(3, grad=False)
    grads_match(lambda a, b: (a * b).sin(), a, b, compiled=cf)
    grads_match(lambda a, b: (a * b).sin(), a.detach(), b.requires_grad_(), compiled=cf)


def test_detach_hands_out_a_tensor_outside_autograd():
    f = lambda x: (x.detach(), x.detach().t(), x * 2)  # noqa: E731
    x = rand(3, 2)
    got, want = kiln.compile(f)(x), f(x)
    for g, w in zip(got, want):
        assert g.requires_grad == w.requires_grad and g is not x
        torch.testing.assert_close(g.detach(), w.detach())


def test_no_grad_uses_the_inference_graph():
    cf = kiln.compile(lambda x: x.sin() * 2)
    before = _counters()
    with torch.no_grad():
        out = cf(rand(3))
    assert not out.requires_grad and _counters()[0] == before[0]


def test_explain_shows_the_backward_and_what_is_saved():
    e = kiln.explain(lambda x, w: torch.tanh(x @ w).sum())(rand(3, 4), rand(4, 5))
    assert e.graph_count == 1 and len(e.backward_graphs) == 1 and e.backward_kernels
    assert e.backward_graphs[0]["saved"] >= 1
    assert "Backward graph 0" in str(e)


def test_remainder_of_a_number_by_a_tensor_raises_in_backward_as_in_eager():
    f = lambda x: (2.0 % x).sum()  # noqa: E731  (torch's remainder.Scalar_Tensor has no derivative)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = kiln.compile(f)(rand(3, low=0.5))
    with pytest.raises(RuntimeError, match="derivative for aten::remainder is not implemented"):
        out.backward()


def test_an_op_without_a_derivative_runs_eagerly_with_its_name():
    """floor_divide has no derivative (in torch neither): the call runs eagerly, with the op
    named, and its backward raises eager's error."""
    import warnings
    f = lambda x: torch.floor_divide(x, 0.5) * x  # noqa: E731
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = rand(3, 4)
        out = kiln.compile(f)(x)
    assert any("no derivative for floor_divide" in str(w.message) for w in caught)
    with pytest.raises(RuntimeError, match="floor_divide"):
        out.sum().backward()
    torch.testing.assert_close(out, f(x.detach()))


# --- dropout in training mode -------------------------------------------------------------------

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])]


def _rate_near(kept, p):
    # the share of zeros within six standard deviations of p
    n = kept.numel()
    dropped = 1 - kept.float().mean().item()
    assert abs(dropped - p) < 6 * (p * (1 - p) / n) ** 0.5, (dropped, p)


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_masks_have_eagers_rate_and_scale_and_the_gradient_uses_the_same_mask(device):
    p = 0.3
    f = lambda x: F.dropout(x, p) * 2  # noqa: E731
    cf = kiln.compile(f)
    x = torch.randn(256, 512, device=device, requires_grad=True)
    before = _counters()
    out = cf(x)
    after = _counters()
    assert after[0] == before[0] + 1 and after[1:] == before[1:], kiln.stats()["fallback_reasons"]
    kept = out != 0
    _rate_near(kept, p)
    torch.testing.assert_close(out[kept], (x * 2 / (1 - p))[kept])
    out.backward(torch.ones_like(out))
    # the backward's mask (recomputed or saved) is the forward's
    torch.testing.assert_close(x.grad, kept.float() * (2 / (1 - p)))


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_is_reproducible_under_manual_seed_and_fresh_on_each_call(device):
    cf = kiln.compile(lambda x: F.dropout(x, 0.5) + F.dropout(x, 0.5))
    x = torch.ones(64, 64, device=device)
    torch.manual_seed(3)
    a = cf(x)
    b = cf(x)
    torch.manual_seed(3)
    c = cf(x)
    assert torch.equal(a, c) and not torch.equal(a, b)
    # two draws in one graph are independent: each 0 or 2, their sum 4 where both kept
    _rate_near(a == 4, 0.75)


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_modules_follow_train_and_eval(device):
    m = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Dropout(0.25), torch.nn.ReLU()).to(device)
    cm = kiln.compile(m)
    x = torch.randn(128, 32, device=device)
    before = _counters()
    h = m[0](x).relu()
    out = cm(x)
    assert _counters()[1:] == before[1:], kiln.stats()["fallback_reasons"]
    kept = out != 0
    _rate_near(kept[h > 0], 0.25)
    torch.testing.assert_close(out[kept], (h / 0.75)[kept])
    m.eval()
    torch.testing.assert_close(cm(x), m(x))
    torch.testing.assert_close(kiln.compile(lambda x: F.dropout(x, 0.5, training=False))(x), x)


# --- models trained for a few steps ------------------------------------------------------------

class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(16, 32)
        self.l2 = torch.nn.Linear(32, 32)
        self.l3 = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.l3(F.gelu(self.l2(torch.tanh(self.l1(x)))))


class Block(torch.nn.Module):
    """A pre-norm transformer block: attention through SDPA, an MLP, residuals."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        # No bias on q, k, v: a key bias has a gradient of zero in exact arithmetic, and AdamW
        # turns the rounding noise there into full-size steps that no two op orders agree on.
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d, bias=False), torch.nn.Linear(d, d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, -1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        # No bias before a BatchNorm: its gradient is zero in exact arithmetic (the norm removes
        # the mean), only rounding noise, which AdamW would scale up to full steps.
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.c2 = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(16, momentum=0.3)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.c1(x))), 2)
        x = F.relu(self.bn2(self.c2(x)))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def _train(model, make_batch, loss_fn, opt_cls, steps, compiled):
    torch.manual_seed(1)
    opt = opt_cls(model.parameters(), lr=0.01)
    run = kiln.compile(model) if compiled else model
    losses, grads = [], []
    for _ in range(steps):
        x, y = make_batch()
        loss = loss_fn(run(x), y)
        opt.zero_grad()
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
        losses.append(loss.item())
    return losses, grads, [p.detach().clone() for p in model.parameters()]


MODELS = {
    "mlp": (MLP, lambda: (torch.randn(8, 16), torch.randint(0, 4, (8,))), F.cross_entropy),
    "transformer_block": (Block, lambda: (torch.randn(2, 6, 32), torch.randn(2, 6, 32)), F.mse_loss),
    "cnn": (SmallCNN, lambda: (torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))), F.cross_entropy),
}


@pytest.mark.parametrize("opt_cls", [lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9),
                                     lambda p, lr: torch.optim.AdamW(p, lr=lr)], ids=["sgd", "adamw"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_trains_like_eager(name, opt_cls):
    cls, batch, loss_fn = MODELS[name]
    torch.manual_seed(0)
    eager_model = cls()
    kiln_model = cls()
    kiln_model.load_state_dict(eager_model.state_dict())
    before = _counters()
    mine = _train(kiln_model, batch, loss_fn, opt_cls, 5, compiled=True)
    after = _counters()
    assert after[0] == before[0] + 1 and after[1:] == before[1:], kiln.stats()["fallback_reasons"]
    theirs = _train(eager_model, batch, loss_fn, opt_cls, 5, compiled=False)
    torch.testing.assert_close(mine[0], theirs[0], rtol=1e-4, atol=1e-5)
    for gm, gt in zip(mine[1], theirs[1]):
        torch.testing.assert_close(gm, gt, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(mine[2], theirs[2], rtol=1e-4, atol=1e-5)
    # buffers (BatchNorm's running statistics and batch count) as eager left them
    torch.testing.assert_close(dict(kiln_model.named_buffers()), dict(eager_model.named_buffers()), rtol=1e-4, atol=1e-6)


def test_batch_norm_training_updates_running_statistics_and_eval_reads_them():
    torch.manual_seed(0)
    eager_model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, bias=False), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                      torch.nn.Flatten(), torch.nn.BatchNorm1d(4 * 6 * 6, affine=False))
    kiln_model = copy.deepcopy(eager_model)
    compiled = kiln.compile(kiln_model)
    for _ in range(3):
        x = torch.randn(5, 3, 8, 8)
        before = _counters()
        got = compiled(x)
        assert _counters()[1:] == before[1:], kiln.stats()["fallback_reasons"]
        want = eager_model(x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        g = torch.randn_like(want)
        got.backward(g)
        want.backward(g)
    for (name, a), b in zip(kiln_model.named_buffers(), eager_model.buffers()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    for a, b in zip(kiln_model.parameters(), eager_model.parameters()):
        # BatchNorm's weight gradient sums g * x_hat, which cancels: float32 rounding of x_hat
        # (normalized in another order than torch's kernel) shows at about 1e-4 of its size.
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-3, atol=1e-4)
    kiln_model.eval()
    eager_model.eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), eager_model(x), rtol=1e-5, atol=1e-5)


def test_batch_norm_training_with_one_value_per_channel_raises_eagers_error():
    bn = torch.nn.BatchNorm1d(3)
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
        kiln.compile(bn)(torch.randn(1, 3))


# --- mixed precision ---------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_llama_under_bf16_autocast_trains_in_one_graph_like_eager(device):
    T = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = T.LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = T.LlamaForCausalLM(cfg).to(device).train()
    eager = copy.deepcopy(model)
    ids = torch.randint(1, 100, (2, 16), device=device)

    def step(m, run):
        with torch.autocast(device, dtype=torch.bfloat16):
            out = run(ids)
        loss = F.cross_entropy(out.logits.flatten(0, 1).float(), ids.flatten())
        loss.backward()
        return loss.detach()

    before = _counters()
    mine = step(model, kiln.compile(model))
    after = _counters()
    assert after[0] == before[0] + 1 and after[1:] == before[1:], kiln.stats()["fallback_reasons"]
    theirs = step(eager, eager)
    torch.testing.assert_close(mine, theirs, rtol=2e-2, atol=2e-2)
    for (n, a), b in zip(model.named_parameters(), eager.parameters()):
        # bf16 matrix products in two evaluation orders: gradients agree to about 1% of their norm
        assert (a.grad - b.grad).norm() <= 3e-2 * b.grad.norm() + 1e-6, n


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("loss", ["cross_entropy", "mse_loss", "nll_loss"])
def test_a_loss_under_cuda_autocast_is_in_the_graph_in_float32(loss):
    # torch's CUDA autocast computes these losses in float32 (cross_entropy through log_softmax
    # and nll_loss, both on its float32 list): kiln casts their inputs so, inside the graph
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).cuda()
    x = torch.randn(4, 16, device="cuda")
    target = torch.randint(0, 8, (4,), device="cuda") if loss != "mse_loss" else torch.randn(4, 8, device="cuda")
    fn = getattr(F, loss)

    def step(m):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = m(x)
            if loss == "nll_loss":
                out = out.log_softmax(-1)
            value = fn(out, target)
        value.backward()
        return value.detach()

    eager = copy.deepcopy(model)
    before = _counters()
    mine = kiln.compile(step)(model)
    after = _counters()
    # one graph with a backward, the loss in it: the only break is backward() itself
    assert after == (before[0] + 1, before[1], before[2] + 1), kiln.stats()["fallback_reasons"]
    theirs = step(eager)
    assert mine.dtype == theirs.dtype == torch.float32
    torch.testing.assert_close(mine, theirs, rtol=2e-2, atol=2e-2)
    for a, b in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=3e-2, atol=3e-2)


# --- torch.utils.checkpoint --------------------------------------------------------------------

def test_checkpoint_recomputes_its_region_in_the_backward():
    from torch.utils.checkpoint import checkpoint

    def block(x, w1, w2):
        return torch.tanh(x @ w1) @ w2

    def plain(x, w1, w2):
        return block(x, w1, w2).sin()

    def ckpt(x, w1, w2):
        return checkpoint(block, x, w1, w2, use_reentrant=False).sin()

    args = (rand(4, 8), rand(8, 16), rand(16, 8))
    grads_match(ckpt, *args)
    saved_plain = kiln.explain(plain)(*args).backward_graphs[0]["saved"]
    saved_ckpt = kiln.explain(ckpt)(*args).backward_graphs[0]["saved"]
    # without it the forward keeps x @ w1 (or its tanh) for the backward; with it only the
    # region's inputs and its result, and the backward runs x @ w1 again
    assert saved_ckpt < saved_plain, (saved_ckpt, saved_plain)


@pytest.mark.parametrize("inputs_need_grad", [True, False])
def test_reentrant_checkpoint_trains_like_eager(inputs_need_grad):
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4).double()

    def fn(x):
        return checkpoint(torch.sin, x, use_reentrant=True) + checkpoint(lin, x, use_reentrant=True).sum()

    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=inputs_need_grad)
    cf = kiln.compile(fn)
    got, want = cf(x), fn(x)
    assert got.requires_grad == want.requires_grad
    torch.testing.assert_close(got, want)
    if inputs_need_grad:
        got.sum().backward()
        gx, gw = x.grad.clone(), lin.weight.grad.clone()
        x.grad = None
        lin.weight.grad = None
        want.sum().backward()
        torch.testing.assert_close(gx, x.grad)
        torch.testing.assert_close(gw, lin.weight.grad)
        e = kiln.explain(cf)(x)
        assert (e.graph_count, e.graph_break_count) == (1, 0)


def test_checkpointed_layers_train_like_eager():
    from torch.utils.checkpoint import checkpoint

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block() for _ in range(2))

        def forward(self, x):
            for b in self.blocks:
                x = checkpoint(b, x, use_reentrant=False)
            return x

    torch.manual_seed(0)
    eager, mine = Net(), Net()
    mine.load_state_dict(eager.state_dict())
    before = _counters()
    got = _train(mine, lambda: (torch.randn(2, 6, 32), torch.randn(2, 6, 32)), F.mse_loss,
                 lambda p, lr: torch.optim.SGD(p, lr=lr), 3, compiled=True)
    after = _counters()
    assert after[0] == before[0] + 1 and after[1:] == before[1:], kiln.stats()["fallback_reasons"]
    want = _train(eager, lambda: (torch.randn(2, 6, 32), torch.randn(2, 6, 32)), F.mse_loss,
                  lambda p, lr: torch.optim.SGD(p, lr=lr), 3, compiled=False)
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got[2], want[2], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_grad_scaler_with_float16_autocast_trains_like_eager(device):
    def run(compiled):
        torch.manual_seed(0)
        model = MLP().to(device)
        fwd = kiln.compile(model) if compiled else model
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 10)
        g = torch.Generator().manual_seed(1)
        losses = []
        for _ in range(3):
            x, y = torch.randn(8, 16, generator=g).to(device), torch.randint(0, 4, (8,), generator=g).to(device)
            with torch.autocast(device, dtype=torch.float16):
                loss = F.cross_entropy(fwd(x).float(), y)
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            losses.append(loss.detach())
        return torch.stack(losses), [p.detach() for p in model.parameters()], scaler.get_scale()

    before = _counters()
    mine = run(True)
    after = _counters()
    assert after[0] == before[0] + 1 and after[1:] == before[1:], kiln.stats()["fallback_reasons"]
    theirs = run(False)
    torch.testing.assert_close(mine[0], theirs[0], rtol=1e-2, atol=1e-2)
    for a, b in zip(mine[1], theirs[1]):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)
    assert mine[2] == theirs[2]


@pytest.mark.parametrize("device", DEVICES)
def test_clamp_at_its_bounds_and_at_nan_has_eagers_gradient(device):
    x = torch.tensor([-1.0, -0.5, 0.0, 0.25, 0.5, 1.0, float("nan")], device=device)
    for f in (lambda x: x.clamp(-0.5, 0.5), lambda x: x.clamp(min=0.0), lambda x: x.clamp(max=0.5)):
        mine, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
        kiln.compile(f)(mine).sum().backward()
        f(theirs).sum().backward()
        torch.testing.assert_close(mine.grad, theirs.grad)


# --- nn.Module's own generators over its tree (parameters(), named_modules(), ...) ------------

class _Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 8)
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 8, bias=False))
        self.head = torch.nn.Linear(8, 10)
        self.head.weight = self.emb.weight  # shared: listed once
        self.register_buffer("scale", torch.tensor(2.0))
        self.skip = None

    def forward(self, ids):
        return self.head(self.body(self.emb(ids)) * self.scale)


def test_module_tree_generators_are_captured_in_torchs_order():
    m = _Tied()

    def names(mod):
        return ([n for n, _ in mod.named_parameters()], [n for n, _ in mod.named_buffers()],
                [n for n, _ in mod.named_modules()], [n for n, _ in mod.named_children()],
                len(list(mod.parameters())), len(list(mod.modules())), len(list(mod.children())),
                [n for n, _ in mod.named_parameters(prefix="m", recurse=False)])

    e = kiln.explain(names)(m)
    assert e.graph_break_count == 0 and not e.break_reasons, e  # Python values only: no graph to run
    before = kiln.stats()["eager_fallbacks"]
    assert kiln.compile(names)(m) == names(m)
    assert kiln.stats()["eager_fallbacks"] == before


def test_an_l2_term_over_parameters_and_clipping_train_in_the_graph():
    torch.manual_seed(0)
    model = _Tied()
    ref = copy.deepcopy(model)

    def loss_of(m, ids, y):
        out = m(ids).flatten(0, 1)
        return F.cross_entropy(out, y) + 1e-3 * sum(p.pow(2).sum() for p in m.parameters())

    ids, y = torch.randint(0, 10, (2, 5)), torch.randint(0, 10, (10,))
    before = _counters()
    mine = kiln.compile(loss_of)(model, ids, y)
    after = _counters()
    assert after == (before[0] + 1, before[1], before[2]), kiln.stats()["fallback_reasons"]
    theirs = loss_of(ref, ids, y)
    torch.testing.assert_close(mine, theirs)
    mine.backward()
    theirs.backward()
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)


def test_a_parameter_reached_only_through_an_unused_output_gets_no_gradient():
    # eager: w2's gradient is None (nothing used the output it flows through), so an optimizer
    # leaves it alone; kiln's one backward node must not hand back zeros for it
    lin1, lin2 = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def two(x):
        return lin1(x).relu(), lin2(x).tanh()

    x = torch.randn(3, 4)
    a, _ = kiln.compile(two)(x)
    a.sum().backward()
    assert lin1.weight.grad is not None and lin2.weight.grad is None and lin2.bias.grad is None
    ga = torch.autograd.grad(kiln.compile(two)(x)[0].sum(), [lin1.weight, lin2.weight], allow_unused=True)
    assert ga[0] is not None and ga[1] is None


def _raises_like_eager(fn, make_inputs, after_call=None):
    """backward() raises autograd's version-counter error in eager and in kiln alike."""
    import re
    errors = []
    for run in (fn, kiln.compile(fn)):
        before = _counters()
        out = run(*make_inputs())
        if run is not fn:  # kiln compiled the call, with its backward, in one graph
            after = _counters()
            assert after == (before[0] + 1, before[1], before[2]), kiln.stats()["fallback_reasons"]
        if after_call:
            after_call(out)
        with pytest.raises(RuntimeError, match=re.escape("modified by an inplace operation")):
            out.sum().backward()
        errors.append(True)
    assert len(errors) == 2


def test_a_saved_result_changed_in_place_in_the_graph_raises_in_backward():
    def f(x):
        y = torch.exp(x)
        y.add_(1)  # exp's backward reads its result
        return y * 2

    def g(x):
        s = torch.log_softmax(x, dim=-1)
        s.mul_(2)
        return s

    def h(x):
        # a torch call kiln has no entry for: torch's autograd node keeps its result
        t = torch.logsumexp(x, 1)
        t.relu_()
        return t

    make = lambda: (torch.randn(4, 5, requires_grad=True),)
    _raises_like_eager(f, make)
    _raises_like_eager(g, make)
    _raises_like_eager(h, make)


def test_a_saved_result_changed_in_place_after_the_call_raises_in_backward():
    def f(x):
        return torch.softmax(x * 3, dim=-1)

    def h(x):
        return torch.tanh(x).view(-1)

    make = lambda: (torch.randn(4, 5, requires_grad=True),)
    _raises_like_eager(f, make, after_call=lambda out: out.add_(1))
    _raises_like_eager(h, make, after_call=lambda out: out[:3].mul_(2))


def test_an_input_autograd_keeps_changed_in_place_raises_in_backward():
    def mul_then_update(x, w):
        h = x * 1.0
        y = h * w  # mul keeps h for w's gradient
        h.add_(1)
        return y

    def matmul_of_views_then_setitem(a):
        t = a[None] @ a[:, None]
        s = torch.matmul(t[..., 0], t[0])  # keeps views of t (fuzz_grad seed 494015)
        t[..., -1] = -1.5  # views share t's version counter
        return s * 2

    def sin_then_update_through_a_view(x):
        h = x + 0
        y = torch.sin(h)
        h[:, 0].mul_(2)
        return y

    _raises_like_eager(mul_then_update, lambda: (torch.randn(4, 5), torch.randn(4, 5, requires_grad=True)))
    # the other way round: x's gradient reads the kept w
    _raises_like_eager(lambda x, w: mul_then_update(w, x), lambda: (torch.randn(4, 5, requires_grad=True), torch.randn(4, 5)))
    _raises_like_eager(matmul_of_views_then_setitem, lambda: (torch.randn(4, requires_grad=True),))
    _raises_like_eager(sin_then_update_through_a_view, lambda: (torch.randn(4, 5, requires_grad=True),))

    def square_then_update(x):
        t = x.sum()
        y = torch.square(t)  # a torch call: torch's node keeps its input (fuzz_grad seed 499835)
        t.clamp_(min=100)
        return y

    def pow_result_then_update(x):
        t = x.sqrt()
        y = torch.pow(t, t)  # keeps its result for the exponent's gradient (seed 499984)
        y.add_(t)
        return y

    _raises_like_eager(square_then_update, lambda: (torch.rand(4, 5, requires_grad=True),))
    _raises_like_eager(pow_result_then_update, lambda: (torch.rand(7, requires_grad=True).add(0.5),))


@pytest.mark.parametrize("op", [
    lambda h: F.softplus(h), lambda h: F.gelu(h), lambda h: F.gelu(h, approximate="tanh"), lambda h: F.silu(h),
    lambda h: F.elu(h), lambda h: F.leaky_relu(h, 0.2), lambda h: F.hardtanh(h), lambda h: F.relu6(h),
    lambda h: F.hardswish(h), lambda h: F.hardsigmoid(h), lambda h: h.clamp(-0.5, 0.5),
    lambda h: torch.maximum(h, h.flip(0)), lambda h: torch.remainder(h.detach() + 3, h)],
    ids=["softplus", "gelu", "gelu_tanh", "silu", "elu", "leaky_relu", "hardtanh", "relu6", "hardswish",
         "hardsigmoid", "clamp", "maximum", "remainder"])
def test_an_activations_input_changed_in_place_raises_in_backward(op):
    # each of these backward ops reads its input (fuzz_grad seed 501519: softplus)
    def f(x):
        h = x * 1.5
        y = op(h)
        h[0].fill_(0.25)
        return y

    _raises_like_eager(f, lambda: (torch.randn(4, 5, requires_grad=True),))


def test_an_in_place_op_reading_its_own_target_as_another_input_raises_in_backward():
    def square_in_place(x):
        t = x * 2
        t *= t  # mul_ keeps `other`, which is t itself, and then updates t (fuzz_grad seed 503098)
        return t

    def row_times_row(x):
        t = x * 2
        t[0].mul_(t[1])  # other is a view of the target's memory
        return t

    _raises_like_eager(square_in_place, lambda: (torch.randn(3, requires_grad=True),))
    _raises_like_eager(row_times_row, lambda: (torch.randn(3, 4, requires_grad=True),))


def test_wheres_condition_changed_in_place_raises_in_backward():
    def f(x):
        c = x > 0
        y = torch.where(c, x, x * 2)  # where's backward reads the condition
        c[0] = True
        return y

    _raises_like_eager(f, lambda: (torch.randn(4, 5, requires_grad=True),))


def test_relus_input_changed_in_place_does_not_raise():
    # relu keeps its result, not its input: eager's backward runs
    def f(x):
        h = x * 1.5
        y = torch.relu(h)
        h.mul_(2)
        return y + h

    x = torch.randn(4, 5, requires_grad=True)
    twin = x.detach().clone().requires_grad_()
    kiln.compile(f)(x).sum().backward()
    f(twin).sum().backward()
    torch.testing.assert_close(x.grad, twin.grad)


def test_inputs_autograd_does_not_keep_may_change_in_place():
    def g(x, w):
        h = x * 2
        y = h * w  # mul keeps h for w's gradient only, and w needs none
        h.add_(1)
        return y + h

    def k(x, w):
        v = w.clone()
        v.mul_(3)  # changed before the product reads it
        return x @ v

    def own_update(c):
        t = c * -1.5
        t.mul_(c)  # mul_ keeps t as it was before its own update (fuzz_grad seed 500090)
        u = t.clone()
        u[:1, -1] = 3.25
        u.abs_()  # abs_ likewise (seed 130116)
        return u

    def own_update_through_a_view(c):
        t = c * 2
        t[:, 0].mul_(c[:, 1])  # a view's update: the scatter of mul_'s own result
        return t

    for fn, make in ((g, lambda: (torch.randn(4, 5, requires_grad=True), torch.randn(4, 5))),
                     (k, lambda: (torch.randn(3, 4, requires_grad=True), torch.randn(4, 5))),
                     (own_update, lambda: (torch.randn(4, 5, requires_grad=True),)),
                     (own_update_through_a_view, lambda: (torch.randn(4, 5, requires_grad=True),))):
        inputs = make()
        twins = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
        kiln.compile(fn)(*inputs).sum().backward()
        fn(*twins).sum().backward()
        torch.testing.assert_close(inputs[0].grad, twins[0].grad)


def test_results_autograd_does_not_save_may_change_in_place():
    def f(x, w):
        y = x * w[0] + 1  # mul saves its inputs, not its result
        y.add_(2)
        return torch.relu(y @ w.t()) + 0

    x, w = torch.randn(4, 5, requires_grad=True), torch.randn(5, 5, requires_grad=True)
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    out = kiln.compile(f)(x, w)
    out.add_(1)
    out.sum().backward()
    ref = f(x2, w2)
    ref.add_(1)
    ref.sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(w.grad, w2.grad)


def test_a_quotient_changed_in_place_does_not_raise():
    # div's backward reads its operands in torch, not its result: no error, in kiln either
    # (kiln's own derivative of div reads the quotient; what counts is what eager saves)
    def f(a, b):
        y = a / b
        y.add_(1)
        return y * 3

    a, b = torch.randn(4, 5, requires_grad=True), torch.rand(4, 5).add(0.5).requires_grad_()
    a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    kiln.compile(f)(a, b).sum().backward()
    f(a2, b2).sum().backward()
    torch.testing.assert_close(a.grad, a2.grad)
    torch.testing.assert_close(b.grad, b2.grad)


def test_linear_weight_gradients_arrive_in_the_weights_layout():
    # eager's autograd hands a linear layer's weight a row-major gradient, which AccumulateGrad
    # keeps as it is; a transposed one it copies into the parameter's layout, every step
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4, bias=False))
    ref = copy.deepcopy(model)
    x = torch.randn(5, 8)
    arrived = {}
    for name, p in model.named_parameters():
        p.register_hook(lambda g, name=name: arrived.__setitem__(name, (g.data_ptr(), g.stride())))
    kiln.reset()
    kiln.compile(model)(x).square().sum().backward()
    ref(x).square().sum().backward()
    assert kiln.stats()["backward_graphs_compiled"] == 1
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
        assert arrived[name][1] == p.stride(), (name, arrived[name][1])
        assert p.grad.data_ptr() == arrived[name][0], f"{name}: AccumulateGrad copied the gradient"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_backward_frees_saved_activations_as_it_goes():
    # Without retain_graph the backward program takes its saved values over and frees each after
    # its last read (torch.compile's boxed calling convention does the same): its peak memory is
    # below a backward that must keep them all (retain_graph=True), and not above eager's.
    # 16 MiB per weight, its gradient and each activation: as the backward goes, weight
    # gradients pile up while the activations behind them could go.
    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [torch.nn.Linear(2048, 2048), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers).cuda()
    x = torch.randn(2048, 2048, device="cuda")
    compiled = kiln.compile(model)

    def backward_peak(run, retain):
        loss = run(x).square().mean()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        loss.backward(retain_graph=retain)
        torch.cuda.synchronize()
        model.zero_grad(set_to_none=True)
        return torch.cuda.max_memory_allocated() - start

    backward_peak(compiled, False)  # compile
    freed = backward_peak(compiled, False)
    kept = backward_peak(compiled, True)
    eager = backward_peak(model, False)
    assert kiln.stats()["backward_graphs_compiled"] >= 1
    assert freed < kept - 3 * 2**24, (freed, kept)  # at least 3 of the 16 MiB activations freed early
    assert freed <= eager * 1.1, (freed, eager)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_abs_gradient_at_zero_and_nan_is_eagers_grad_times_sgn(dtype):
    # torch: grad * sgn(x), sgn 0 at ±0 and at nan, so a nan or infinite gradient stays nan
    # there and a negative one gives -0 (gradient fuzzer seed 491875)
    x = torch.tensor([0.0, -0.0, float("nan"), 1.0, -2.0, 0.0], dtype=dtype)
    g = torch.tensor([float("nan"), float("inf"), 1.0, float("nan"), 2.0, -3.0], dtype=dtype)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch.abs(a).backward(g)
    before = kiln.stats()["backward_graphs_compiled"]
    kiln.compile(lambda t: t.abs())(b).backward(g)
    assert kiln.stats()["backward_graphs_compiled"] == before + 1
    torch.testing.assert_close(b.grad, a.grad, equal_nan=True, rtol=0, atol=0)
    assert torch.equal(b.grad.signbit(), a.grad.signbit())


@pytest.mark.parametrize("mode", ["floor", "trunc"])
def test_rounding_division_passes_zeros_back_even_for_a_nan_gradient(mode):
    # torch's derivative of div(..., rounding_mode=...) is grad.zero_(): zeros where the
    # incoming gradient is NaN or infinite too, not grad * 0 (gradient fuzzer seed 523030)
    def fn(a, b):
        return torch.div(a, b, rounding_mode=mode)

    a, b = torch.randn(5, dtype=torch.float64), torch.randn(5, dtype=torch.float64) + 3
    g = torch.tensor([float("nan"), float("inf"), 1.0, -float("inf"), 2.0], dtype=torch.float64)
    want = [t.clone().requires_grad_() for t in (a, b)]
    fn(*want).backward(g)
    got = [t.clone().requires_grad_() for t in (a, b)]
    before = kiln.stats()["backward_graphs_compiled"]
    kiln.compile(fn)(*got).backward(g)
    assert kiln.stats()["backward_graphs_compiled"] == before + 1
    for x, y in zip(got, want):
        assert torch.equal(x.grad, y.grad), (x.grad, y.grad)


def test_relu_passes_the_gradient_on_at_a_nan_input_as_torch_does():
    # torch's threshold_backward: result <= 0 ? 0 : grad, so a NaN input's gradient flows (and
    # is NaN after a NaN-making op before it); grad fuzz seed 531148
    x = torch.tensor([float("nan"), -1.0, 0.0, 2.0, float("inf")], dtype=torch.float64)
    g = torch.tensor([0.5, 1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch.relu(a * 2).backward(g)
    before = kiln.stats()["backward_graphs_compiled"]
    kiln.compile(lambda t: torch.relu(t * 2))(b).backward(g)
    assert kiln.stats()["backward_graphs_compiled"] == before + 1
    torch.testing.assert_close(b.grad, a.grad, equal_nan=True, rtol=0, atol=0)


def test_copy_into_a_tensor_autograd_tracks_keeps_it_tracked():
    # eager: the result of copy_ still requires grad, and passes zeros back to the old value
    # (fuzz_grad seed 509203); a source that needs grad gets the gradient
    def of_number(b):
        t = torch.erf(b)
        t.copy_(0.0)
        return torch.std(t, -1).sum() + b.sum()

    def of_tensor(b, w):
        t = b * 2
        t[:, :2].copy_(w)
        return (t * t).sum()

    for fn, make in ((of_number, lambda: (torch.randn(2, 5, requires_grad=True),)),
                     (of_tensor, lambda: (torch.randn(3, 4, requires_grad=True), torch.randn(3, 2, requires_grad=True)))):
        inputs = make()
        twins = [t.detach().clone().requires_grad_() for t in inputs]
        before = _counters()
        ours = kiln.compile(fn)(*inputs)
        assert _counters()[0] == before[0] + 1 and _counters()[1] == before[1], kiln.stats()["fallback_reasons"]
        ref = fn(*twins)
        assert ours.requires_grad and ref.requires_grad
        ours.backward()
        ref.backward()
        for a, b in zip(inputs, twins):
            torch.testing.assert_close(a.grad, b.grad)


def test_a_saved_view_has_the_layout_the_backward_was_compiled_for():
    """GPTBigCode's multi-query attention in training: k is a slice of one projection, grown by
    a cat onto the cache's empty tensor and reshaped. Eager's cat makes a new contiguous k; kiln
    reads the slice in place, and handed the saved k out with the slice's strides, which the
    backward program read as contiguous: every gradient wrong, the loss right."""
    torch.manual_seed(0)
    weight = torch.randn(12, 12)
    empty = torch.tensor([])

    def fn(x):
        y = x @ weight
        q, k, v = y.unsqueeze(1).split((4, 4, 4), dim=3)
        q = q.view(1, 4, 1, 4).transpose(1, 2)
        k = torch.cat([empty, k], -2)
        k = k[:, :, None].expand(1, 1, 1, 4, 4).reshape(1, 1, 4, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).sum()

    x0 = torch.randn(1, 4, 12)
    x = x0.clone().requires_grad_()
    (want,) = torch.autograd.grad(fn(x), x)
    x = x0.clone().requires_grad_()
    before = kiln.stats()["backward_graphs_compiled"]
    (got,) = torch.autograd.grad(kiln.compile(fn)(x), x)
    assert kiln.stats()["backward_graphs_compiled"] > before
    torch.testing.assert_close(got, want)


def test_equal_gradients_of_two_parameters_are_separate_tensors():
    # A residual block's two batch-norm biases get the same gradient (the sum of the block's
    # output gradient): the backward computes it once, and each parameter must still get a .grad
    # of its own, or accumulating over micro-batches adds every step twice into one of them.
    from torchvision.models.resnet import BasicBlock
    torch.manual_seed(0)
    down = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 1, stride=2, bias=False), torch.nn.BatchNorm2d(16))
    model = BasicBlock(8, 16, stride=2, downsample=down).train()
    ref = copy.deepcopy(model)
    compiled = kiln.compile(model)
    for _ in range(3):  # no zero_grad: the gradients accumulate
        x = torch.randn(2, 8, 8, 8)
        compiled(x).square().sum().backward()
        ref(x).square().sum().backward()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=name)
    storages = [p.grad.untyped_storage().data_ptr() for p in model.parameters()]
    assert len(set(storages)) == len(storages)
    assert kiln.explain(model)(x).graph_count == 1


def test_convolution_results_are_saved_for_the_backward_in_their_own_layout():
    # kiln computes convolutions in channels-last and hands their results on row-major; what
    # the backward reads of them is saved as the convolution wrote it, with no copy made
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 4)).train()
    ref = copy.deepcopy(model)
    compiled = kiln.compile(model)
    for _ in range(2):
        model.zero_grad(), ref.zero_grad()
        x = torch.randn(4, 3, 32, 32)
        torch.testing.assert_close(compiled(x), ref(x), rtol=1e-4, atol=1e-5)
        compiled(x).sum().backward()
        ref(x).sum().backward()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=name)
    e = kiln.explain(model)(x)
    assert e.graph_count == 1 and e.backward_graphs
    copies = [k.name for k in e.kernels if re.fullmatch(r"kernel\d+_contiguous", k.name)]  # a copy alone
    assert not copies, copies


def test_module_backward_hooks_fire_and_change_gradients_as_in_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    model[1].register_full_backward_pre_hook(lambda mod, go: (go[0] * 2,))
    calls = []
    model.register_full_backward_hook(lambda mod, gi, go: calls.append(1))  # on the compiled module itself
    ref = copy.deepcopy(model)
    compiled = kiln.compile(model)
    x = torch.randn(2, 3)
    ref(x).sum().backward()
    compiled(x).sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert len(calls) == 2  # once for ref (a deep copy keeps hooks), once for the compiled call
    # a hook added after the first compiled call is seen (a guard on the hook dicts)
    plain = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    c = kiln.compile(plain)
    c(x).sum().backward()
    seen = []
    plain[0].register_full_backward_hook(lambda mod, gi, go: seen.append(1))
    c(x).sum().backward()
    assert seen == [1]


def _same_seed_grads(make, x):
    torch.manual_seed(0)
    model = make()
    ref = copy.deepcopy(model)
    compiled = kiln.compile(model)
    outs = []
    for m in (ref, compiled):
        torch.manual_seed(1)
        xi = x.clone().requires_grad_()
        y = m(xi)
        y = y[0] if isinstance(y, tuple) else y
        y.square().sum().backward()
        outs.append((y.detach(), xi.grad))
    return outs


@pytest.mark.parametrize("name", ["gru_dropout", "fractional_max_pool", "attention_dropout"])
def test_random_torch_calls_are_not_drawn_again_in_the_backward(name):
    # a torch call's gradient re-runs it: one that draws random numbers runs eagerly, so its
    # gradient belongs to the mask its output used (same seed: eager's output and gradient)
    make, x = {
        "gru_dropout": (lambda: torch.nn.GRU(4, 8, num_layers=2, dropout=0.5), torch.randn(5, 2, 4)),
        "fractional_max_pool": (lambda: torch.nn.FractionalMaxPool2d(2, output_size=(5, 5)), torch.randn(1, 2, 9, 9)),
        "attention_dropout": (lambda: torch.nn.MultiheadAttention(8, 2, dropout=0.5, batch_first=True),
                              torch.randn(2, 6, 8)),
    }[name]
    if name == "attention_dropout":
        mha = make
        make = lambda: _SelfAttention(mha())  # noqa: E731
    (ye, ge), (yk, gk) = _same_seed_grads(make, x)
    torch.testing.assert_close(yk, ye)
    torch.testing.assert_close(gk, ge)


class _SelfAttention(torch.nn.Module):
    def __init__(self, mha):
        super().__init__()
        self.mha = mha

    def forward(self, x):
        return self.mha(x, x, x, need_weights=False)[0]


def test_instance_norm_running_statistics_are_updated_once():
    torch.manual_seed(0)
    m = torch.nn.InstanceNorm2d(2, track_running_stats=True)
    ref = copy.deepcopy(m)
    x = torch.randn(2, 2, 4, 4, requires_grad=True)
    ref(x).pow(2).sum().backward()
    kiln.compile(m)(x).pow(2).sum().backward()
    torch.testing.assert_close(m.running_mean, ref.running_mean)
    torch.testing.assert_close(m.running_var, ref.running_var)


@pytest.mark.parametrize("flag", ["scale_grad_by_freq", "sparse"])
def test_embedding_gradient_flags(flag):
    torch.manual_seed(0)
    m = torch.nn.Embedding(5, 2, **{flag: True})
    ref = copy.deepcopy(m)
    idx = torch.tensor([1, 2, 2, 3])
    ref(idx).sum().backward()
    kiln.compile(m)(idx).sum().backward()
    assert m.weight.grad.layout == ref.weight.grad.layout
    torch.testing.assert_close(m.weight.grad.to_dense(), ref.weight.grad.to_dense())


def test_a_parametrization_runs_once_a_call():
    from torch.nn.utils import parametrize

    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, w):
            with torch.no_grad():
                self.calls += 1
            return w * 2
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 2)
    parametrize.register_parametrization(m, "weight", Scale())
    ref = copy.deepcopy(m)
    compiled = kiln.compile(m)
    x = torch.randn(4, 3)
    for _ in range(3):
        ref(x).sum().backward()
        compiled(x).sum().backward()
        assert m.parametrizations.weight[0].calls.item() == ref.parametrizations.weight[0].calls.item()
        torch.testing.assert_close(m.parametrizations.weight.original.grad, ref.parametrizations.weight.original.grad)
    # spectral_norm's power iteration: one step a call, as eager's
    sn, sn_ref = (torch.nn.utils.parametrizations.spectral_norm(torch.nn.Linear(4, 4)) for _ in range(2))
    sn_ref.load_state_dict(sn.state_dict())
    c = kiln.compile(sn)
    for _ in range(2):
        c(x.repeat(1, 2)[:, :4]).sum().backward()
        sn_ref(x.repeat(1, 2)[:, :4]).sum().backward()
    torch.testing.assert_close(sn.parametrizations.weight[0]._u, sn_ref.parametrizations.weight[0]._u)


@pytest.mark.parametrize("op", [torch.maximum, torch.minimum])
def test_maximum_and_minimum_gradients_with_nan_and_ties(op):
    # torch zeroes only the operand the other one beats: a NaN beats nothing and is beaten by
    # nothing, so both operands get the gradient there; equal operands split it
    a = torch.tensor([0.0, float("inf"), -1.0, float("nan"), 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    b = torch.tensor([0.0, 1.0, float("nan"), float("nan"), 5.0, -3.0], dtype=torch.float64, requires_grad=True)
    grads = []
    for f in (op, kiln.compile(lambda x, y: op(x, y))):
        a.grad = b.grad = None
        (f(a, b) * torch.arange(1.0, 7.0, dtype=torch.float64)).sum().backward()
        grads.append((a.grad.clone(), b.grad.clone()))
    torch.testing.assert_close(grads[1], grads[0], equal_nan=True)
    # through a ReLU of the same tensor (fuzz_grad seed 586051)
    t = torch.tensor([-1.0, 0.0, 2.0, float("nan")], dtype=torch.float64, requires_grad=True)
    out = []
    for f in (lambda t: op(t, F.relu(t)), kiln.compile(lambda t: op(t, F.relu(t)))):
        t.grad = None
        f(t).sum().backward()
        out.append(t.grad.clone())
    torch.testing.assert_close(out[1], out[0], equal_nan=True)


# --- in-place ops under torch.no_grad() on tensors autograd tracks ---------------------------------

def _no_grad_view_update(a):
    y = a * 2
    with torch.no_grad():
        y[0].mul_(3)
    return (y * a).sum(0)


def _no_grad_add_of_tracked(a, b):
    y = a.sin()
    with torch.no_grad():
        y.add_(b)
    return y * b


@pytest.mark.parametrize("fn,shapes", [(_scaled_without_history, [(3, 4)]), (_no_grad_view_update, [(3, 4)]),
                                       (_no_grad_add_of_tracked, [(3, 4), (4,)])], ids=["mul_", "view", "add_"])
def test_inplace_under_no_grad_keeps_the_tensors_history(fn, shapes):
    """Eager changes the values and leaves the history: the gradient flows as before the update
    (a clamp of a weight in the forward used to drop every gradient)."""
    for _ in range(2):
        grads_match(fn, *[rand(*s) for s in shapes])


def test_parameter_clamped_under_no_grad_in_forward_gets_its_gradient():
    class Clamped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 3, dtype=torch.float64))

        def forward(self, x):
            with torch.no_grad():
                self.w.clamp_(max=0.5)
            return (x @ self.w).tanh()

    mine = Clamped()
    theirs = copy.deepcopy(mine)
    compiled = kiln.compile(mine)
    start = _counters()
    for _ in range(3):
        x = torch.randn(2, 4, dtype=torch.float64)
        got = compiled(x)
        want = theirs(x)
        assert got.requires_grad and want.requires_grad
        torch.testing.assert_close(got, want)
        t = torch.randn_like(want)
        got.backward(t)
        want.backward(t)
        torch.testing.assert_close(mine.w, theirs.w)
        torch.testing.assert_close(mine.w.grad, theirs.w.grad)
    end = _counters()
    assert end[0] == start[0] + 1 and end[1:] == start[1:], kiln.stats()["fallback_reasons"]


def test_inplace_update_that_makes_an_input_require_grad_keeps_its_history():
    """x.add_(y) and x[0] = y with y tracked and x not: eager gives x a history of its own."""
    def add(x, y):
        return x.add_(y)

    def setitem(x, y):
        x[0] = y * 2
        return x.sum()

    for fn, ysize in ((add, (3,)), (setitem, ())):
        cf = kiln.compile(fn)
        for _ in range(2):
            x = torch.randn(3, dtype=torch.float64)
            y = torch.randn(ysize, dtype=torch.float64)
            xm, ym = x.clone(), y.clone().requires_grad_()
            xt, yt = x.clone(), y.clone().requires_grad_()
            got, want = cf(xm, ym), fn(xt, yt)
            assert got.requires_grad == want.requires_grad and xm.requires_grad == xt.requires_grad
            torch.testing.assert_close(got, want)
            torch.testing.assert_close(xm, xt)
            (got * 3).sum().backward()
            (want * 3).sum().backward()
            torch.testing.assert_close(ym.grad, yt.grad)


def test_native_batch_norm_updates_running_statistics_once():
    def f(x, rm, rv):
        return torch.native_batch_norm(x, None, None, rm, rv, True, 0.5, 1e-5)

    cf = kiln.compile(f)
    for _ in range(2):
        x = torch.randn(4, 3)
        stats_mine = [torch.zeros(3), torch.ones(3)]
        stats_theirs = [torch.zeros(3), torch.ones(3)]
        got, want = cf(x, *stats_mine), f(x, *stats_theirs)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
        for g, w in zip(stats_mine, stats_theirs):
            torch.testing.assert_close(g, w)


def test_view_outputs_are_autograd_views_of_their_base():
    """An output that views a tracked input, or another output, is that tensor's view as in
    eager: an in-place change of it reaches the base's gradient (CopySlices)."""
    def of_input(a):
        return a.view(-1)

    def of_output(a):
        y = a * 2
        return y, y.view(-1)

    for _ in range(2):
        x = torch.randn(2, 3, dtype=torch.float64)
        xm, xt = x.clone().requires_grad_(), x.clone().requires_grad_()
        am, at = xm * 1, xt * 1
        got, want = kiln.compile(of_input)(am), of_input(at)
        assert got._base is am and want._base is at
        got.mul_(3)
        want.mul_(3)
        (am * am).sum().backward()
        (at * at).sum().backward()
        torch.testing.assert_close(xm.grad, xt.grad)

        xm, xt = x.clone().requires_grad_(), x.clone().requires_grad_()
        (ym, vm), (yt, vt) = kiln.compile(of_output)(xm), of_output(xt)
        assert vm._base is ym and vt._base is yt
        vm.mul_(3)
        vt.mul_(3)
        (ym * 2).sum().backward()
        (yt * 2).sum().backward()
        torch.testing.assert_close(xm.grad, xt.grad)


def test_batch_norm_running_variance_in_float64_is_float64_exact():
    """The unbiased variance's count / (count - 1) was a float32 ratio: off by 1e-7 in float64."""
    for dt, tol in ((torch.float64, 1e-13), (torch.float32, 1e-5)):
        bn = torch.nn.BatchNorm2d(4, momentum=0.5).to(dt).train()
        ref = copy.deepcopy(bn)
        x = torch.randn(3, 4, 7, 7, dtype=dt) * 3
        torch.testing.assert_close(kiln.compile(bn)(x), ref(x))
        torch.testing.assert_close(bn.running_var, ref.running_var, rtol=tol, atol=tol)
        torch.testing.assert_close(bn.running_mean, ref.running_mean, rtol=tol, atol=tol)


def test_results_made_under_no_grad_do_not_require_grad():
    """torch's kernels a graph calls (embedding, losses, sort) ran under the caller's grad mode:
    their results under no_grad took a grad_fn, and a frozen teacher's weights trained."""
    teacher = torch.nn.Embedding(10, 4)
    x = torch.randn(3, 5, requires_grad=True)
    y = torch.tensor([1, 0, 4])

    def targets(ids, x, y):
        with torch.no_grad():
            return teacher(ids), F.cross_entropy(x * 2, y), torch.sort(x, 1).values, F.mse_loss(x, x.flip(0))

    ids = torch.tensor([1, 2, 3])
    got, want = kiln.compile(targets)(ids, x, y), targets(ids, x, y)
    for g, w in zip(got, want):
        assert g.requires_grad is False and w.requires_grad is False and g.grad_fn is None
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("kw", [{"dropout_p": 0}, {"scale": 1}, {"dropout_p": 0, "scale": 2}])
def test_attention_with_python_int_dropout_or_scale(kw):
    def f(q, k):
        return F.scaled_dot_product_attention(q, k, k, **kw)

    grads_match(f, rand(2, 4, 6, 8), rand(2, 4, 6, 8))


def test_transformer_encoder_layer_with_int_dropout_trains():
    layer = torch.nn.TransformerEncoderLayer(d_model=16, nhead=4, dropout=0).double().train()
    ref = copy.deepcopy(layer)
    x = torch.randn(5, 3, 16, dtype=torch.float64)
    got, want = kiln.compile(layer)(x), ref(x)
    torch.testing.assert_close(got, want)
    got.square().sum().backward()
    want.square().sum().backward()
    for a, b in zip(layer.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad)


def test_embedding_module_keeps_scale_grad_by_freq_and_sparse():
    ids = torch.tensor([[1, 1, 2], [1, 4, 4]])
    for kw in ({"scale_grad_by_freq": True}, {"sparse": True}):
        mine = torch.nn.Embedding(6, 3, **kw)
        theirs = copy.deepcopy(mine)
        kiln.compile(lambda i: mine(i).square().sum())(ids).backward()
        theirs(ids).square().sum().backward()
        assert mine.weight.grad.is_sparse == theirs.weight.grad.is_sparse
        torch.testing.assert_close(mine.weight.grad.to_dense(), theirs.weight.grad.to_dense())
    bag, ref = torch.nn.EmbeddingBag(6, 3, sparse=True), None
    ref = copy.deepcopy(bag)
    kiln.compile(bag)(ids).sum().backward()
    ref(ids).sum().backward()
    assert bag.weight.grad.is_sparse
    torch.testing.assert_close(bag.weight.grad.to_dense(), ref.weight.grad.to_dense())


def test_a_changed_saved_result_only_a_condition_reads_raises_nothing():
    """rsqrt saves its result, which neg_ then changes; the result only feeds where's condition,
    which no gradient crosses, so eager's backward raises nothing (fuzz_grad seed 596017)."""
    def f(a, b):
        t0 = torch.rsqrt(b)
        t0.neg_()
        return torch.where(t0 <= 0, b, a) * 2

    grads_match(f, rand(5, 3), rand(5, 1, low=0.5))


def test_two_backward_calls_in_a_compiled_function():
    """The second graph reads `e` only through e.detach(): no gradient reaches e, so its node
    has no edge to the graph that made e, which the first backward() freed."""
    def f(a, b):
        e = a.sin()
        e.sum().backward()
        (b * e.detach()).sum().backward()

    grads = []
    for fn in (f, kiln.compile(f)):
        torch.manual_seed(0)
        a, b = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
        fn(a, b)
        grads.append((a.grad, b.grad))
    torch.testing.assert_close(grads[1], grads[0])


def test_batch_norm_training_on_an_empty_batch_keeps_the_running_statistics():
    m, ref = torch.nn.BatchNorm1d(3), torch.nn.BatchNorm1d(3)
    out = kiln.compile(m)(torch.randn(0, 3))
    ref(torch.randn(0, 3))
    assert out.shape == (0, 3)
    torch.testing.assert_close(m.running_mean, ref.running_mean)
    torch.testing.assert_close(m.running_var, ref.running_var)
    assert int(m.num_batches_tracked) == int(ref.num_batches_tracked)


def test_poisson_nll_loss_is_captured_as_the_loss_it_is():
    import torch.nn.functional as F

    f = lambda x, t: F.poisson_nll_loss(x, t)
    x, t = torch.randn(4, 5, requires_grad=True), torch.rand(4, 5)
    e = kiln.explain(kiln.compile(f))(x, t)
    assert (e.graph_count, e.graph_break_count) == (1, 0), e.break_reasons
    torch.testing.assert_close(kiln.compile(f)(x, t), f(x, t))


def test_gradients_through_views_of_the_incoming_gradient_over_symbolic_sizes():
    # stack's gradient is a reshape of a slice of the incoming one; built without the capture's
    # sizes, its shape rule took the reshape for a copy, and the compile then made it a view with
    # a copy's strides: both inputs got the first half of the gradient (OpInfo sweep, stack)
    def f(a, b):
        return torch.stack((a, b), -1)

    cf = kiln.compile(f, dynamic=True)
    for shape in ((2, 1, 3), (4, 1, 5), (3, 2, 2)):
        a = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
        b = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
        g = torch.randn(*shape, 2, dtype=torch.float64)
        got = torch.autograd.grad(cf(a, b), (a, b), g)
        want = torch.autograd.grad(f(a, b), (a, b), g)
        for x, y in zip(got, want):
            torch.testing.assert_close(x, y)
