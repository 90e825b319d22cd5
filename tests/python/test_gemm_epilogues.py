"""GEMM epilogues on CUDA (issue 12, part 4): a linear layer followed by ReLU or tanh-GELU runs
as one cuBLASLt GEMM with the bias and the activation in its epilogue (torch's
_addmm_activation), not a GEMM and a kernel; the exact GELU keeps its kernel. With
max-autotune the epilogue is timed against the plain GEMM and the faster kept. Results equal
eager on fresh inputs; each test checks the compiled graph holds what it claims."""
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from _helpers import assert_same

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 3e-3}


def _graph_text(cf, *args):
    return "\n".join(kiln.explain(cf)(*args).graphs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", [nn.ReLU(), nn.GELU(approximate="tanh")], ids=["relu", "gelu_tanh"])
def test_linear_and_activation_are_one_gemm(dtype, act):
    model = nn.Sequential(nn.Linear(256, 512), act, nn.Linear(512, 64)).cuda().to(dtype).eval()
    cf = kiln.compile(model)
    with torch.no_grad():
        for shape in [(8, 256)] * 2 + [(4, 16, 256)]:
            x = torch.randn(*shape, device="cuda", dtype=dtype)
            assert_same(cf(x), model(x), rtol=TOL[dtype], atol=TOL[dtype])
        text = _graph_text(cf, x)
    assert "addmm_activation" in text and not re.search(r"= (relu|gelu)\(", text), text


def test_the_exact_gelu_keeps_its_kernel():
    model = nn.Sequential(nn.Linear(128, 128), nn.GELU()).cuda().eval()
    cf = kiln.compile(model)
    x = torch.randn(32, 128, device="cuda")
    with torch.no_grad():
        assert_same(cf(x), model(x), rtol=1e-4, atol=1e-4)
        text = _graph_text(cf, x)
    assert "addmm_activation" not in text and re.search(r"= gelu\(", text), text


def test_a_gemm_result_used_twice_is_not_fused():
    lin = nn.Linear(64, 64).cuda()

    def f(x):
        y = lin(x)
        return F.relu(y), y * 2

    cf = kiln.compile(f)
    x = torch.randn(16, 64, device="cuda")
    with torch.no_grad():
        assert_same(cf(x), f(x), rtol=1e-4, atol=1e-4)
        assert "addmm_activation" not in _graph_text(cf, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_max_autotune_times_the_gemms_and_equals_eager(tmp_path, monkeypatch, dtype):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    kiln.reset()
    model = nn.Sequential(nn.Linear(768, 3072), nn.ReLU(), nn.Linear(3072, 768), nn.LayerNorm(768)).cuda().to(dtype).eval()
    cf = kiln.compile(model, mode="max-autotune-no-cudagraphs")
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(512, 768, device="cuda", dtype=dtype)
            assert_same(cf(x), model(x), rtol=TOL[dtype] * 3, atol=TOL[dtype] * 3)
    assert kiln.stats()["kernels_autotuned"] >= 2  # the GEMMs' choices and the layer_norm's launch


def test_torch_addmm_activation_called_directly_compiles():
    b, a, w = torch.randn(32, device="cuda"), torch.randn(16, 24, device="cuda"), torch.randn(24, 32, device="cuda")
    cf = kiln.compile(lambda b, a, w: torch._addmm_activation(b, a, w, use_gelu=True) + 1)
    assert_same(cf(b, a, w), torch._addmm_activation(b, a, w, use_gelu=True) + 1, rtol=1e-4, atol=1e-4)
    assert kiln.stats()["eager_fallbacks"] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_folded_convolutions_bias_joins_the_relu_kernel(dtype):
    # The folded batch norm's bias is added in the kernel that applies the ReLU (and the
    # residual add), not by torch's separate add_ after cuDNN's convolution.
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
            self.conv2, self.bn2 = nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16)

        def forward(self, x):
            return F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))) + x)

    model = Block().cuda().eval()
    for bn in (model.bn1, model.bn2):  # statistics eval mode will fold in
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    model = model.to(dtype)
    cf = kiln.compile(model)
    # cuDNN's float32 convolutions run in TF32: eager rounds the weight, kiln the folded weight
    # (test_prologue.py's _close); bfloat16 rounds each convolution's result.
    rtol, atol = (3e-3, 1e-2) if dtype == torch.float32 else (5e-2, 1e-1)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(4, 16, 12, 12, device="cuda", dtype=dtype)
            assert_same(cf(x), model(x), rtol=rtol, atol=atol)
        text = _graph_text(cf, x)
    convs = re.findall(r"= conv2d\((.*)\)", text)
    assert convs, text
    if dtype == torch.float32:  # folded (16-bit batch norms are not: see fold_batch_norm.cpp)
        assert all(c.split(", ")[2] == "None" for c in convs), text
