"""Shared fixtures for kiln's Python tests.

``device`` runs a test on the CPU and, where a CUDA device is present, on the GPU too (the GPU
case carries the ``gpu`` marker that pyproject.toml registers, so ``-m "not gpu"`` leaves it out).
The comparison helper lives in ``_helpers.py`` and is also offered here as the ``check`` fixture.
"""
import pytest
import torch

from _helpers import check as _check


@pytest.fixture(
    params=[
        "cpu",
        pytest.param(
            "cuda",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
            ],
        ),
    ]
)
def device(request):
    return request.param


@pytest.fixture
def check():
    return _check


@pytest.fixture
def quiet_fallbacks():
    """kiln's fallback warnings off for a test whose eager calls are expected (a sweep of other
    projects' cases), restored after it for the other files."""
    import kiln

    before = kiln.config.suppress_fallback_warnings
    kiln.config.suppress_fallback_warnings = True
    yield
    kiln.config.suppress_fallback_warnings = before
