"""torch.autograd.Function with a gradient: the forward and the user's backward in one graph.

As TorchDynamo does, kiln captures Function.apply where an input needs a gradient: the forward
(under no_grad, as autograd runs it) becomes ops of the graph, and the backward, captured once
from a placeholder gradient, is the derivative of the Function's result (`custom_vjp`). Each
test compares the loss and every gradient with eager on fresh inputs and checks that the call
compiled as one graph with no break (a graph break or a fallback fails it).
"""
import pytest
import torch
import torch.nn as nn
from torch.autograd.function import once_differentiable

import kiln
from _helpers import assert_same


class Swish(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return g * (s * (1 + x * (1 - s)))


class ReverseGrad(torch.autograd.Function):  # a domain-adaptation gradient reversal layer
    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g.neg() * ctx.alpha, None


class StraightThroughRound(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.round(x * 4) / 4

    @staticmethod
    def backward(ctx, g):
        return g


class ScaledMul(torch.autograd.Function):  # two tensor inputs, gradients where needed
    @staticmethod
    def forward(ctx, a, b, scale):
        ctx.save_for_backward(a, b)
        ctx.scale = scale
        return a * b * scale

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        ga = g * b * ctx.scale if ctx.needs_input_grad[0] else None
        gb = g * a * ctx.scale if ctx.needs_input_grad[1] else None
        return ga, gb, None


class SetupContextExp(torch.autograd.Function):  # forward without ctx, then setup_context
    @staticmethod
    def forward(x):
        return x.exp()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y


class OnceDifferentiableSquare(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


class BroadcastBias(torch.autograd.Function):  # a gradient of the broadcast shape: summed
    @staticmethod
    def forward(ctx, x, b):
        return x + b

    @staticmethod
    def backward(ctx, g):
        return g, g


class NonDifferentiableIndex(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        idx = x.argmax(-1)
        ctx.mark_non_differentiable(idx)
        return idx

    @staticmethod
    def backward(ctx, g):
        return None


def _grads_match(fn, make_args, *, graphs=1, breaks=0, calls=3, rtol=None, atol=None):
    kiln.reset()
    cf = kiln.compile(fn)
    for _ in range(calls):
        args = make_args()
        mine = [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]
        theirs = [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]
        out, ref = cf(*mine), fn(*theirs)
        assert_same(out, ref, rtol=rtol, atol=atol)
        out.backward()
        ref.backward()
        for a, b in zip(mine, theirs):
            if isinstance(a, torch.Tensor) and a.requires_grad:
                assert (a.grad is None) == (b.grad is None)
                if a.grad is not None:
                    assert_same(a.grad, b.grad, rtol=rtol, atol=atol)
    e = kiln.explain(fn)(*make_args())
    assert (e.graph_count, e.graph_break_count) == (graphs, breaks), e.break_reasons
    s = kiln.stats()
    assert s["eager_fallbacks"] == 0, s["fallback_reasons"]


def _xw():
    return torch.randn(6, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)


def test_a_custom_activation_and_its_backward_in_one_graph():
    _grads_match(lambda x, w: Swish.apply(x @ w).pow(2).sum(), _xw)


def test_a_gradient_reversal_layer_with_a_python_scale():
    _grads_match(lambda x, w: (ReverseGrad.apply(torch.tanh(x @ w), 0.3) ** 2).sum(), _xw)


def test_a_straight_through_estimator():
    _grads_match(lambda x, w: StraightThroughRound.apply(x @ w).sin().sum(), _xw)


def test_only_the_inputs_that_need_a_gradient_get_one():
    def fn(a, b):
        return ScaledMul.apply(a, b, 1.5).sum()

    _grads_match(fn, lambda: (torch.randn(5, requires_grad=True), torch.randn(5)))
    _grads_match(fn, lambda: (torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)))


def test_setup_context_and_a_saved_result():
    _grads_match(lambda x: SetupContextExp.apply(x * 0.5).sum(), lambda: (torch.randn(7, requires_grad=True),))


def test_once_differentiable_backward():
    _grads_match(lambda x: OnceDifferentiableSquare.apply(x.cos()).mean(), lambda: (torch.randn(3, 4, requires_grad=True),))


def test_a_gradient_of_a_broadcast_shape_is_summed_to_the_input():
    _grads_match(lambda x, b: BroadcastBias.apply(x, b).tanh().sum(),
                 lambda: (torch.randn(4, 5, requires_grad=True), torch.randn(5, requires_grad=True)))


def test_the_same_function_applied_twice():
    _grads_match(lambda x, w: Swish.apply(Swish.apply(x @ w) @ w).sum(), _xw)


def test_in_a_module_trained_for_three_steps_with_sgd():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 1)

        def forward(self, x):
            return self.b(ReverseGrad.apply(Swish.apply(self.a(x)), 0.5))

    torch.manual_seed(0)
    m = Block()
    ref = Block()
    ref.load_state_dict(m.state_dict())
    kiln.reset()
    cm = kiln.compile(m)
    opt, ropt = torch.optim.SGD(m.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(3):
        x, y = torch.randn(10, 8), torch.randn(10, 1)
        loss, rloss = ((cm(x) - y) ** 2).mean(), ((ref(x) - y) ** 2).mean()
        assert_same(loss, rloss)
        opt.zero_grad(), ropt.zero_grad()
        loss.backward(), rloss.backward()
        opt.step(), ropt.step()
    for p, q in zip(m.parameters(), ref.parameters()):
        assert_same(p, q, rtol=1e-5, atol=1e-6)
    assert kiln.stats()["eager_fallbacks"] == 0, kiln.stats()["fallback_reasons"]


def test_without_a_gradient_the_forward_alone_is_captured():
    with torch.no_grad():
        _grads_match_no_grad = kiln.compile(lambda x: Swish.apply(x).sum())
        x = torch.randn(5)
        assert_same(_grads_match_no_grad(x), Swish.apply(x).sum())


def test_mark_non_differentiable_runs_the_call_for_real():
    def fn(x):
        y = x.sin() * 2
        return y.gather(-1, NonDifferentiableIndex.apply(y).unsqueeze(-1)).sum()

    kiln.reset()
    cf = kiln.compile(fn)
    x = torch.randn(3, 5, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    out, ref = cf(x), fn(xe)
    assert_same(out, ref)
    out.backward()
    ref.backward()
    assert_same(x.grad, xe.grad)


def test_a_backward_returning_too_few_gradients_raises_as_eager_does():
    class Bad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            return a * b

        @staticmethod
        def backward(ctx, g):
            return g

    def fn(a, b):
        return Bad.apply(a, b).sum()

    a, b = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError) as eager_error:
        fn(a, b).backward()
    with pytest.raises(RuntimeError) as kiln_error:
        kiln.compile(fn)(a, b).backward()
    assert str(kiln_error.value) == str(eager_error.value)


def test_double_backward_through_a_custom_function_is_eager_or_an_error_not_a_wrong_number():
    def fn(x):
        return Swish.apply(x).sum()

    x = torch.randn(4, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    (g,) = torch.autograd.grad(kiln.compile(fn)(x), x, create_graph=True)
    (ge,) = torch.autograd.grad(fn(xe), xe, create_graph=True)
    assert_same(g, ge)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_custom_function_on_cuda_under_bf16_autocast():
    def fn(x, w):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h = ReverseGrad.apply(Swish.apply(x @ w), 0.5)
        return h.float().pow(2).mean()

    _grads_match(fn, lambda: (torch.randn(16, 32, device="cuda", requires_grad=True),
                              torch.randn(32, 32, device="cuda", requires_grad=True)), rtol=2e-2, atol=2e-2)


def test_a_custom_function_under_cpu_bf16_autocast():
    def fn(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = ReverseGrad.apply(Swish.apply(x @ w), 0.5)
        return h.float().pow(2).mean()

    _grads_match(fn, lambda: (torch.randn(16, 32, requires_grad=True), torch.randn(32, 32, requires_grad=True)),
                 rtol=2e-2, atol=2e-2)


class _ConstantGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return a * 2

    @staticmethod
    def backward(ctx, g):  # reads nothing of g: the gradient is a forward value
        (a,) = ctx.saved_tensors
        return torch.full_like(a, 2.0) + a.detach() * 0


def test_a_custom_backward_that_ignores_the_incoming_gradient_is_compiled():
    # the partitioner never saved a gradient that does not read the incoming one, and the
    # backward could not be built ("map::at"): the call ran eagerly
    fn = lambda a: _ConstantGrad.apply(a) * 3  # noqa: E731
    xa = torch.randn(4, dtype=torch.float64, requires_grad=True)
    xb = xa.detach().clone().requires_grad_()
    ya = kiln.compile(fn, fullgraph=True)(xa)
    ya.sum().backward()
    fn(xb).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad)
