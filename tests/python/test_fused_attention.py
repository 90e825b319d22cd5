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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mask_kind", ["additive", "by_query"])
def test_attention_gradients_over_a_packed_projection_need_no_copies(device, mask_kind, monkeypatch, capfd):
    # q, k and v as views of one projection (BERT, GPT-2): torch's attention backward gives
    # their gradients in empty_like's layout, which kiln plans for; a mask broadcast along the
    # keys (last stride 0) reaches torch row-major, so its GPU backward is the fused one
    B, L, H, E = 2, 16, 4, 8
    torch.manual_seed(0)
    proj = torch.nn.Linear(H * E, 3 * H * E).to(device)

    def fn(x, mask):
        q, k, v = proj(x).split(H * E, dim=-1)
        q, k, v = [t.view(B, L, H, E).transpose(1, 2) for t in (q, k, v)]
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    x = torch.randn(B, L, H * E, device=device, requires_grad=True)
    if mask_kind == "additive":
        mask = torch.randn(B, 1, L, L, device=device)
    else:
        mask = torch.randn(L, 1, device=device).expand(B, 1, L, L)
    monkeypatch.setenv("KILN_LOGS", "copies")
    kiln.reset()
    compiled = kiln.compile(fn)
    for _ in range(2):
        out = compiled(x, mask)
        gx, gw = torch.autograd.grad(out.square().sum(), (x, proj.weight))
    monkeypatch.delenv("KILN_LOGS")
    assert kiln.stats()["backward_graphs_compiled"] == 1
    want = fn(x, mask)
    wx, ww = torch.autograd.grad(want.square().sum(), (x, proj.weight))
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gx, wx, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gw, ww, rtol=1e-4, atol=1e-5)
    copies = [line for line in capfd.readouterr().err.splitlines() if "aten_vjp" in line]
    assert not copies, copies


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
def test_grouped_query_attention_is_torchs_operator_with_its_gradients(device, causal):
    """F.scaled_dot_product_attention(..., enable_gqa=True), as Hugging Face's Llama, Mistral and
    Qwen2 call it: kiln's extern op (not a torch_call through Python), with eager's result,
    layout and gradients."""
    def fn(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    q = torch.randn(2, 8, 32, 16, device=device, requires_grad=True)
    k, v = (torch.randn(2, 2, 32, 16, device=device, requires_grad=True) for _ in range(2))
    graphs = "".join(kiln.explain(fn)(q, k, v).graphs)
    assert "scaled_dot_product_attention(" in graphs and "torch_call" not in graphs, graphs
    mine = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    want, got = fn(q, k, v), kiln.compile(fn)(*mine)
    assert got.stride() == want.stride()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(want)
    want.backward(grad)
    got.backward(grad)
    for a, b in zip(mine, (q, k, v)):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-5)
