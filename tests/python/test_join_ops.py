"""torch.cat / torch.concat / torch.stack as kiln ops: an output element read from the one input
that holds it, fused with the ops that make the inputs and the ops that read the result (a
Llama rotary embedding is one kernel), on CPU and CUDA, each against eager on fresh inputs."""
import pytest
import torch

import kiln
from _helpers import assert_same, check


def _kernels(fn, *args):
    e = kiln.explain(fn)(*args)
    assert e.graph_count == 1 and not e.break_reasons, e
    assert "torch_call" not in e.graphs[0], e.graphs[0]  # kiln's op, not torch's operator
    return [k.name for k in e.kernels]


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rotary(q, cos, sin):
    return q * cos + rotate_half(q) * sin


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rotary_embedding_is_one_kernel(device, dtype):
    q = torch.randn(2, 4, 16, 64, device=device, dtype=dtype)
    cos, sin = torch.randn(1, 1, 16, 64, device=device, dtype=dtype), torch.randn(1, 1, 16, 64, device=device, dtype=dtype)
    check(rotary, q, cos, sin)
    assert len(_kernels(rotary, q, cos, sin)) == 1


def cat_dims(a, b, c):
    return torch.cat([a, b, c], 0), torch.cat((a.transpose(0, 1), b.transpose(0, 1)), dim=-1) * 2


def test_cat_along_each_dim_and_of_transposed_inputs(device):
    a, b, c = (torch.randn(n, 5, device=device) for n in (3, 1, 4))
    b = torch.randn(3, 5, device=device)
    check(cat_dims, a, b, c)


def mixed(a, b, c):
    return torch.cat([a, b, c], 1)


@pytest.mark.parametrize("dtypes", [(torch.float16, torch.float32, torch.bfloat16), (torch.int64, torch.bool, torch.int32),
                                    (torch.bool, torch.bool, torch.bool), (torch.int32, torch.float16, torch.float64)])
def test_cat_promotes_as_torch(device, dtypes):
    args = []
    for n, t in zip((2, 3, 1), dtypes):
        x = torch.randn(4, n, device=device) * 5
        args.append(x > 0 if t == torch.bool else x.to(t))
    check(mixed, *args)


def cat_concat(a, b):
    return torch.concat([a, b], dim=-2).relu(), torch.cat([a.sin()], 0)


def test_concat_spelling_and_a_single_tensor(device):
    check(cat_concat, torch.randn(2, 3, 4, device=device), torch.randn(2, 5, 4, device=device))


def cat_channels_last(a, b):
    return torch.cat([a, b], 1) + 1


def test_channels_last_inputs_give_a_channels_last_result(device):
    a = torch.randn(2, 3, 4, 5, device=device).to(memory_format=torch.channels_last)
    b = torch.randn(2, 6, 4, 5, device=device).to(memory_format=torch.channels_last)
    check(cat_channels_last, a, b)
    check(cat_channels_last, a, b.contiguous())  # mixed formats: row-major, as torch


def grow(cache, new):
    return torch.cat([cache, new], dim=-2)


def test_cache_grown_by_cat_under_dynamic_shapes(device):
    compiled = kiln.compile(grow, dynamic=True)
    recompiles = kiln.stats()["recompiles"]
    cache = torch.randn(1, 2, 3, 8, device=device)
    for _ in range(4):
        new = torch.randn(1, 2, 1, 8, device=device)
        out = compiled(cache, new)
        assert_same(out, grow(cache, new))
        cache = out
    assert kiln.stats()["recompiles"] == recompiles
    assert "torch_call" not in kiln.explain(compiled)(cache, new).graphs[0]


def stacked(a, b, c):
    return torch.stack([a, b, c]), torch.stack((a, b), dim=-1).sum(0), torch.stack([a.sum(), b.sum()])


def test_stack(device):
    check(stacked, *(torch.randn(3, 4, device=device) for _ in range(3)))


def stacked_then_viewed(b):
    t = torch.stack((b, -b), dim=2)
    return t, t.view(t.shape[0], t.shape[1], t.shape[2], 2, -1)


def test_stack_result_is_row_major_whatever_its_inputs(device):
    # Unsqueezed, a transposed 3-d tensor looks channels-last, which cat would follow; torch.stack
    # writes a row-major result (fuzzer seed 97054: the view's strides differed from eager's).
    b = torch.randn(4, 4, 4, device=device).transpose(1, 2)
    out = kiln.compile(stacked_then_viewed)(b)
    ref = stacked_then_viewed(b)
    for o, r in zip(out, ref):
        assert o.stride() == r.stride()
        torch.testing.assert_close(o, r)
    assert kiln.explain(stacked_then_viewed)(b).graph_count == 1


def many(xs):
    return torch.cat(xs, 1) * 2


def test_more_inputs_than_one_kernel_reads_run_through_torch():
    xs = [torch.randn(2, 1) for _ in range(20)]
    check(many, xs)


def _raises_as_eager(fn, *args):
    with pytest.raises(Exception) as eager:
        fn(*args)
    with pytest.raises(type(eager.value)) as ours:
        kiln.compile(fn)(*args)
    assert str(ours.value).split("\n")[0] == str(eager.value).split("\n")[0]


def cat1(a, b):
    return torch.cat([a, b], 1)


def stack0(a, b):
    return torch.stack([a, b])


@pytest.mark.parametrize("shapes", [((2, 3), (3, 3)), ((2, 3), (2, 3, 1)), ((2, 3), ()), ((2, 3), (2, 9))])
def test_bad_shapes_raise_as_eager(shapes):
    a, b = torch.randn(shapes[0]), torch.randn(shapes[1])
    if shapes[1] == (2, 9):
        _raises_as_eager(stack0, a, b)
    else:
        _raises_as_eager(cat1, a, b)


def cat_number(a):
    return torch.cat([a, 1], 0)


def test_a_number_in_the_list_raises_as_eager():
    _raises_as_eager(cat_number, torch.randn(3))


def legacy_empty(a):
    return torch.cat([a, torch.tensor([])], 0) + 1


def test_legacy_empty_tensor_is_skipped_as_torch_does():
    check(legacy_empty, torch.randn(2, 3))


def test_eager_backend_passes_the_list():
    def fn(a, b):
        return torch.stack([a, b]).flatten() + torch.cat([a, b]) + torch.arange(6)

    a, b = torch.randn(3), torch.randn(3)
    fallbacks = kiln.stats()["eager_fallbacks"]
    assert_same(kiln.compile(fn, backend="eager")(a, b), fn(a, b))
    assert kiln.stats()["eager_fallbacks"] == fallbacks


def test_cat_and_stack_of_every_layout_equal_eager_in_values_and_strides(device):
    # Row-major, reversed and channels-last inputs of 3, 4 and 5 dims, joined along every dim.
    # The CPU kernels once read one element of a cat of reversed 3-d inputs from the wrong place
    # (GCC's AVX2 gathers); stack once made a row-major result where torch keeps the
    # channels-last layout cat gives.
    def make(shape, order):
        return torch.randn([shape[p] for p in order], device=device).permute([order.index(i) for i in range(len(order))])

    for shape in [(4, 3, 5), (5, 2, 2, 3), (2, 3, 2, 2, 4)]:
        n = len(shape)
        for order in [tuple(range(n)), tuple(reversed(range(n))), (0,) + tuple(range(2, n)) + (1,)]:
            a, b = make(shape, order), make(shape, order)
            for dim in range(-n - 1, n + 1):
                cat_dim = max(min(dim, n - 1), -n)

                def fn(x, y, dim=dim, cat_dim=cat_dim):
                    return torch.stack([x * 1, y + 1, x - y], dim=dim), torch.cat([x * 1, y], dim=cat_dim)

                want, got = fn(a, b), kiln.compile(fn)(a, b)
                for g, w in zip(got, want):
                    assert torch.equal(g, w), (shape, order, dim)
                    assert g.stride() == w.stride(), (shape, order, dim, g.stride(), w.stride())


def test_cat_with_an_empty_part_reads_nothing_of_it(device):
    # an empty tensor may have no memory at all (a null pointer): the kernel must not load from
    # it, even at an index clamped into it (fuzz seed 497103 crashed there)
    b = torch.randn(2, 3, dtype=torch.float64, device=device)
    empty = torch.randn(2, 0, device=device)
    check(lambda b, e: torch.cat([b, e], 1) * 2, b, empty)
    check(lambda b, e: torch.cat([e, b, e], 1), b, empty)
