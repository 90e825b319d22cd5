"""Split reductions (schedule::split_reductions): a reduction of many points into few outputs
(a training batch norm's per-channel statistics, its backward's sums, a whole tensor's sum)
runs as partial results over many GPU blocks or CPU threads and a kernel combining them. Each
test compares with eager on fresh inputs and checks that the split happened (more kernels than
the reductions alone would take)."""
import pytest
import torch

import kiln

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])]


def _tol(dtype):
    return dict(rtol=1e-4, atol=1e-3) if dtype == torch.float32 else dict(rtol=2e-2, atol=5e-2)


def _kernels(fn, *args):
    e = kiln.explain(fn)(*args)
    assert e.graph_count == 1 and not e.break_reasons, e
    return e.kernels


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_per_channel_statistics_and_whole_tensor_reductions(device, dtype, channels_last):
    shape = (16, 64, 112, 112) if device == "cuda" else (8, 16, 96, 96)
    x = torch.randn(*shape, device=device, dtype=dtype) * 3 + 1
    if channels_last:
        x = x.to(memory_format=torch.channels_last)

    def stats(x):
        mean = x.float().mean(dim=(0, 2, 3), keepdim=True)
        var = ((x.float() - mean) ** 2).mean(dim=(0, 2, 3))
        return mean.flatten(), var, x.amax(dim=(0, 2, 3)), x.amin(), x.sum(dtype=torch.float32)
    compiled = kiln.compile(stats)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), stats(x), **_tol(dtype))
        x = torch.randn_like(x)
    # five reductions, three of them into one output each, split: partials and totals
    assert len(_kernels(stats, x)) > 5
    nan = x.clone()
    nan[3, 5, 7, 11] = float("nan")
    torch.testing.assert_close(compiled(nan), stats(nan), equal_nan=True, **_tol(dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_integer_and_boolean_whole_tensor_reductions(device):
    i = torch.randint(-1000, 1000, (1 << 22,), device=device)

    def f(i):
        return i.sum(), i.max(), (i > 990).any(), (i > -1001).all(), (i % 7).sum()
    compiled = kiln.compile(f)
    for _ in range(2):
        assert all(torch.equal(a, b) for a, b in zip(compiled(i), f(i)))
        i = torch.randint(-1000, 1000, i.shape, device=device)
    assert len(_kernels(f, i)) > 1


@pytest.mark.parametrize("device", DEVICES)
def test_a_product_splits_only_on_the_gpu(device):
    # torch's CPU product folds in an order kiln follows; splitting would reorder it
    x = 1 + torch.randn(1 << 21, device=device, dtype=torch.float64) * 1e-6
    compiled = kiln.compile(lambda x: x.prod())
    torch.testing.assert_close(compiled(x), x.prod())
    n = len(_kernels(lambda x: x.prod(), x))
    assert n == (1 if device == "cpu" else 2)


@pytest.mark.parametrize("device", DEVICES)
def test_training_batch_norm_of_a_large_activation(device):
    shape = (16, 64, 112, 112) if device == "cuda" else (8, 16, 96, 96)
    bn = torch.nn.BatchNorm2d(shape[1]).to(device).train()
    ref = torch.nn.BatchNorm2d(shape[1]).to(device).train()
    ref.load_state_dict(bn.state_dict())
    x = torch.randn(*shape, device=device).to(memory_format=torch.channels_last)
    f = kiln.compile(bn)
    for _ in range(2):
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = f(xa), ref(xb)
        g = torch.randn_like(ya)
        ya.backward(g), yb.backward(g)
        torch.testing.assert_close(ya, yb, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(bn.weight.grad, ref.weight.grad, rtol=1e-4, atol=1e-2)
        torch.testing.assert_close(bn.bias.grad, ref.bias.grad, rtol=1e-4, atol=1e-2)
        torch.testing.assert_close(bn.running_mean, ref.running_mean)
        torch.testing.assert_close(bn.running_var, ref.running_var)
        x = torch.randn_like(x)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,dims", [((8192, 100), (0,)), ((3, 4096, 17), (0, 1)), ((64, 7, 9, 2048), (0, 1, 2))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32])
def test_column_sums_of_a_contiguous_kept_dim(device, shape, dims, dtype):
    # the kept dim is the contiguous one (a bias's gradient over rows): outputs side by side,
    # in GPU lanes or CPU vector lanes, with what follows the sums fused after them
    x = (torch.randn(*shape, device=device) * 10).to(dtype)

    def f(x):
        s = x.sum(dim=dims)
        return s, s * 2 + 1, (x * x).sum(dim=dims)
    compiled = kiln.compile(f)
    for _ in range(2):
        got, want = compiled(x), f(x)
        if dtype.is_floating_point:
            # a float32 sum's rounding grows with the magnitudes it adds (torch's CPU sums
            # cascade, kiln's add along lanes): the bound scales with the sum of |x|
            atol = (1e-6 if dtype == torch.float32 else 1e-14) * (x * x).abs().sum(dim=dims).max().item()
            torch.testing.assert_close(got, want, rtol=1e-5, atol=atol)
        else:
            assert all(torch.equal(a, b) for a, b in zip(got, want))
        x = (torch.randn(*shape, device=device) * 10).to(dtype)
