"""torch operators kiln has no registry entry for run as extern calls inside the graph
(`torch_call` nodes), never as graph breaks: one graph, eager's results, on CPU and GPU."""
import pytest
import torch
import torch.nn.functional as F

import kiln


def cat_between_kernels(a, b):
    return torch.cat([a.sin(), b * 2], dim=0).cos()


def stack_then_add(a, b):
    return torch.stack([a, b], dim=1) + 1


def topk_values_and_indices(a, b):
    v, i = a.topk(2, dim=-1)
    return v * 2 + b[:, :2], i


def cumsum_method(a, b):
    return a.cumsum(1) * 2 - b


def chunk_into_three(a, b):
    q, k, v = torch.cat([a, b, a - b], dim=-1).chunk(3, dim=-1)
    return q + k * v


def nearest_upsample(a, b):
    return F.interpolate((a + b)[None, None], scale_factor=2.0, mode="nearest").squeeze()


def einsum_gram(a, b):
    return torch.einsum("ij,kj->ik", a, b)


def pad_last_dim(a, b):
    return F.pad(a, (1, 2)) * 3 + F.pad(b, (2, 1))


def triangles(a, b):
    return torch.tril(a) + torch.triu(b, 1) * 2


def sort_descending(a, b):
    vals, idx = torch.sort(a + b, dim=1, descending=True)
    return vals.exp(), idx


def sdpa(a, b):
    q = a.reshape(2, 2, 3, 2)
    return F.scaled_dot_product_attention(q, q * 0.5, b.reshape(2, 2, 3, 2))


CASES = [cat_between_kernels, stack_then_add, topk_values_and_indices, cumsum_method, chunk_into_three,
         nearest_upsample, einsum_gram, pad_last_dim, triangles, sort_descending, sdpa]


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_extern_call_in_one_graph(fn, device):
    def make():
        return torch.randn(4, 6, device=device), torch.randn(4, 6, device=device)
    e = kiln.explain(fn)(*make())
    assert e.graph_count == 1 and not e.break_reasons, str(e)
    # chunk became slices (views), sdpa a registry extern (issue 11: sizes stay symbolic), cat
    # and stack kiln's gather op
    expected = {"chunk_into_three": "slice(", "sdpa": "scaled_dot_product_attention(", "cat_between_kernels": "cat(",
                "stack_then_add": "cat("}.get(fn.__name__, "torch_call")
    assert expected in e.graphs[0]
    compiled = kiln.compile(fn)
    for _ in range(2):
        args = make()
        torch.testing.assert_close(compiled(*args), fn(*args))


def test_chunk_results_are_not_updated_in_place_through_kiln():
    # chunk returns views: an in-place update of one must reach the base, so kiln leaves it to Python
    def f(x):
        y = x * 2
        a, b = y.chunk(2, dim=0)
        a.add_(1)
        return y
    x = torch.randn(4, 3)
    torch.testing.assert_close(kiln.compile(f)(x), f(x))


def test_random_ops_are_not_externs():
    # a draw is kiln's own node (test_random_draws.py), never a torch call whose order against
    # eager's generator stream would matter; one with a generator of its own stays torch's
    def f(x):
        return x + torch.rand_like(x)
    e = kiln.explain(f)(torch.randn(3))
    assert not e.break_reasons and "torch_call" not in e.captured and "random_uniform" in e.captured

    def g(x, gen):
        return x + torch.rand(3, generator=gen)
    e = kiln.explain(g)(torch.randn(3), torch.Generator())
    assert e.break_reasons and "rand" in e.break_reasons[0]["reason"]


def test_extern_shape_error_is_eagers():
    def f(a, b):
        return torch.cat([a, b], dim=1)
    a, b = torch.randn(2, 3), torch.randn(4, 3)
    with pytest.raises(RuntimeError) as eager:
        f(a, b)
    with pytest.raises(RuntimeError) as compiled:
        kiln.compile(f)(a, b)
    assert str(compiled.value) == str(eager.value)


@pytest.mark.parametrize("loss,n,target", [("multi_margin_loss", 0, [0]), ("multilabel_margin_loss", 0, [0]),
                                           ("multi_margin_loss", 4, [1]), ("multilabel_margin_loss", 4, [2, 0, -1, 1])])
def test_a_torch_call_whose_meta_kernel_gives_another_shape_runs_in_python(loss, n, target):
    """torch's meta kernel gives F.multi_margin_loss(0-d input, reduction='none') the shape [1]
    where its kernel gives []: the compiled graph expected [1] and raised at run time."""
    x = torch.tensor(-8.5) if n == 0 else torch.randn(n)
    t = torch.tensor(target[0]) if len(target) == 1 else torch.tensor(target)
    fn = lambda x, t: getattr(torch.nn.functional, loss)(x, t, reduction="none") * 2  # noqa: E731
    got, want = kiln.compile(fn)(x, t), fn(x, t)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want)


def test_an_input_a_torch_calls_autograd_graph_does_not_reach_gets_no_gradient():
    """hinge_embedding_loss reads its target only through a comparison, linalg.norm(x, 0) counts
    nonzeros: eager's autograd gives those inputs None (an optimizer skips them), not zeros."""
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0], dtype=torch.float64, requires_grad=True)
    hinge = lambda x, y: F.hinge_embedding_loss(x, y, margin=2.0)  # noqa: E731
    want = torch.autograd.grad(hinge(x, y), (x, y), allow_unused=True)
    got = torch.autograd.grad(kiln.compile(hinge)(x, y), (x, y), allow_unused=True)
    assert want[1] is None and got[1] is None
    torch.testing.assert_close(got[0], want[0])
    count = lambda x: torch.linalg.norm(x, 0) + x.sum()  # noqa: E731
    mine = x.detach().clone().requires_grad_()
    kiln.compile(count)(mine).backward()
    theirs = x.detach().clone().requires_grad_()
    count(theirs).backward()
    torch.testing.assert_close(mine.grad, theirs.grad)
    only_norm = lambda x: torch.linalg.norm(x, 0)  # noqa: E731
    mine = x.detach().clone().requires_grad_()
    kiln.compile(only_norm)(mine).backward()
    assert mine.grad is None
