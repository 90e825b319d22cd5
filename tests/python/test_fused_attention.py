"""Attention written out by hand runs as torch's fused scaled_dot_product_attention (issue 12,
part 4 on the GPU; issue 14, part 3 on the CPU, where torch's flash kernel walks blocks of keys
with an online softmax; passes::fuse_attention): results equal eager's, and the compiled graph
holds the fused op instead of two matrix products and a softmax."""
import math

import pytest
import torch

import kiln
from _helpers import check

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])]
TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 2e-3), torch.bfloat16: (2e-2, 2e-2)}


def attention(q, k, v):
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def masked_attention(q, k, v, mask):
    scores = q @ k.transpose(-1, -2) * 0.125 + mask
    return torch.softmax(scores, -1) @ v


def attention_block(q, k, v):
    # the fused op's [B, L, H, E] result read by the block's reshape, as a model does
    b, h, t, e = q.shape
    return attention(q, k, v).transpose(1, 2).reshape(b, t, h * e).relu()


def _qkv(dtype, device, b=2, h=4, t=64, e=64):
    return tuple(torch.randn(b, h, t, e, device=device).to(dtype) for _ in range(3))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fn", [attention, attention_block])
def test_hand_written_attention_is_fused_and_equals_eager(dtype, fn, device):
    args = _qkv(dtype, device)
    graphs = "".join(kiln.explain(fn)(*args).graphs)
    assert "scaled_dot_product_attention" in graphs and "softmax" not in graphs, graphs
    check(fn, *args, rtol=TOL[dtype][0], atol=TOL[dtype][1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_additive_mask(dtype, device):
    q, k, v = _qkv(dtype, device)
    mask = torch.zeros(2, 1, 64, 64, device=device).masked_fill(torch.ones(64, 64, device=device).triu(1).bool(), -1e4).to(dtype)
    assert "scaled_dot_product_attention" in "".join(kiln.explain(masked_attention)(q, k, v, mask).graphs)
    check(masked_attention, q, k, v, mask, rtol=TOL[dtype][0], atol=TOL[dtype][1])


@pytest.mark.parametrize("device", DEVICES)
def test_scores_used_elsewhere_are_not_fused(device):
    def fn(q, k, v):
        scores = q @ k.transpose(-2, -1) / 8
        return torch.softmax(scores, -1) @ v, scores.amax(-1)

    q, k, v = _qkv(torch.float32, device)
    assert "scaled_dot_product_attention" not in "".join(kiln.explain(fn)(q, k, v).graphs)
    check(fn, q, k, v, rtol=1e-4, atol=1e-4)
