"""Whole models in one graph: convolution, batch norm, pooling, residual blocks."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])]


def _one_graph(fn, *args):
    e = kiln.explain(fn)(*args)
    assert e.graph_count == 1 and not e.break_reasons, e
    return e


@pytest.mark.parametrize("device", DEVICES)
def test_conv_bn_relu_sequential_is_one_graph(device):
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()).to(device).eval()
    with torch.no_grad():
        m[1].running_mean.uniform_(-1, 1)
        m[1].running_var.uniform_(0.5, 2)
        x = torch.randn(2, 3, 16, 16, device=device)
        e = _one_graph(m, x)
        # batch norm and relu fuse into one kernel after the conv (a second one copies the
        # row-major input channels-last for cuDNN or oneDNN: passes::channels_last_convolutions)
        assert len([k for k in e.kernels if "relu" in k.name]) == 1, [k.name for k in e.kernels]
        assert len(e.kernels) == 2, [k.name for k in e.kernels]
        torch.testing.assert_close(kiln.compile(m)(x), m(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_functional_conv_pool(device):
    def f(x, w, b):
        y = F.conv2d(x, w, b, stride=2, padding=1)
        return F.adaptive_avg_pool2d(F.max_pool2d(torch.relu(y), 3, stride=2, padding=1), 1).flatten(1)
    x = torch.randn(2, 4, 32, 32, device=device)
    w, b = torch.randn(6, 4, 3, 3, device=device), torch.randn(6, device=device)
    _one_graph(f, x, w, b)
    torch.testing.assert_close(kiln.compile(f)(x, w, b), f(x, w, b), rtol=1e-4, atol=1e-4)


def test_batchnorm_training_mode_is_one_graph_under_no_grad():
    # batch statistics in the graph, the running statistics written back (training with a
    # backward: test_training.py)
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    ref = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    ref.load_state_dict(m.state_dict())
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(2, 3, 8, 8)
            torch.testing.assert_close(kiln.compile(m)(x), ref(x))
        torch.testing.assert_close(m[1].running_mean, ref[1].running_mean)
        torch.testing.assert_close(m[1].running_var, ref[1].running_var)
        e = kiln.explain(m)(x)
        assert e.graph_count == 1 and not e.break_reasons, e


@pytest.mark.parametrize("device", DEVICES)
def test_resnet18(device):
    torchvision = pytest.importorskip("torchvision")
    m = torchvision.models.resnet18().to(device).eval()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.1, 0.1)
                mod.running_var.uniform_(0.5, 1.5)
        x = torch.randn(2, 3, 64, 64, device=device)
        _one_graph(m, x)
        cm = kiln.compile(m)
        # cuDNN may pick different (TF32) convolution algorithms from call to call.
        tol = 1e-3 if device == "cpu" else 1e-2
        torch.testing.assert_close(cm(x), m(x), rtol=tol, atol=tol)
        x2 = torch.randn(2, 3, 64, 64, device=device)
        torch.testing.assert_close(cm(x2), m(x2), rtol=tol, atol=tol)


# The torchvision models issue 4 names, random weights, small inputs: one graph, no break, eager's
# outputs. Batch norm statistics are randomized so that normalization is not the identity.
TORCHVISION = [
    ("resnet18", 64), ("resnet50", 64), ("mobilenet_v2", 64), ("mobilenet_v3_small", 64), ("efficientnet_b0", 64),
    ("vgg11", 32), ("densenet121", 64), ("squeezenet1_0", 64), ("shufflenet_v2_x0_5", 64), ("convnext_tiny", 64),
    ("vit_b_16", 32), ("swin_t", 64),
]


@pytest.mark.parametrize("name,size", TORCHVISION, ids=[n for n, _ in TORCHVISION])
def test_torchvision_model_in_one_graph(name, size, device):
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    kw = {"image_size": size} if name.startswith("vit") else {}
    m = getattr(torchvision.models, name)(weights=None, **kw).to(device).eval()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.1, 0.1)
                mod.running_var.uniform_(0.8, 1.2)
        x = torch.randn(2, 3, size, size, device=device)
        _one_graph(m, x)
        compiled = kiln.compile(m)
        # TF32 convolutions and matmuls pick algorithms call by call on the GPU: compare in float32
        tf32 = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
        try:
            for _ in range(2):
                x = torch.randn(2, 3, size, size, device=device)
                tol = 1e-3 if device == "cuda" else 1e-4
                torch.testing.assert_close(compiled(x), m(x), rtol=tol, atol=tol)
        finally:
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
