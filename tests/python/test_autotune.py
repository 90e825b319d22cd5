"""mode="max-autotune" (issue 12, part 3): the launch of each of kiln's CUDA kernels is chosen by
timing its candidates on the first compile, the winner is kept in the disk cache, and a later
compile (this process after kiln.reset(), or a fresh process) reads it instead of timing again.
Every test compares with eager on fresh inputs and checks through kiln.stats() that kernels
were timed, or read from the cache, as it claims."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from _helpers import assert_same
from _process import child_result, run_child

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _tuning():
    s = kiln.stats()
    return s["kernels_autotuned"], s["autotune_cache_hits"]


def _block(x, w, b):
    # a row kernel (layer_norm), a softmax, and a pointwise GELU over a large tensor
    h = F.layer_norm(x, (x.shape[-1],), w, b)
    return F.gelu(h * 2 + 1), torch.softmax(h, dim=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernels_are_timed_on_the_first_compile_and_equal_eager(tmp_path, monkeypatch, dtype):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    kiln.reset()
    cf = kiln.compile(_block, mode="max-autotune-no-cudagraphs")
    w, b = torch.randn(768, device="cuda", dtype=dtype), torch.randn(768, device="cuda", dtype=dtype)
    for _ in range(3):
        x = torch.randn(64, 128, 768, device="cuda", dtype=dtype)
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        assert_same(cf(x, w, b), _block(x, w, b), rtol=tol, atol=tol)
    timed, hits = _tuning()
    assert timed >= 1 and hits == 0, (timed, hits)
    kernels = kiln.explain(cf)(x, w, b).kernels
    assert kernels and all(k.launch.startswith("grid=") for k in kernels), [k.launch for k in kernels]
    assert any("autotuned" in k.launch for k in kernels), [k.launch for k in kernels]


def test_a_second_compile_reads_the_winners_from_the_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    kiln.reset()
    w, b = torch.randn(512, device="cuda"), torch.randn(512, device="cuda")
    x = torch.randn(32, 64, 512, device="cuda")
    first = kiln.compile(_block, mode="max-autotune")
    assert_same(first(x, w, b), _block(x, w, b), rtol=1e-4, atol=1e-4)
    timed, _ = _tuning()
    assert timed >= 1
    kiln.reset()  # the in-memory caches go; the disk cache stays
    again = kiln.compile(_block, mode="max-autotune")
    x = torch.randn(32, 64, 512, device="cuda")
    assert_same(again(x, w, b), _block(x, w, b), rtol=1e-4, atol=1e-4)
    assert _tuning() == (0, timed), _tuning()
    assert any("from the disk cache" in k.launch for k in kiln.explain(again)(x, w, b).kernels)


def test_a_fresh_process_does_not_time_again(tmp_path):
    code = """
        import json, torch, torch.nn.functional as F, kiln
        def f(x):
            return torch.softmax(x * 3, dim=-1) + F.silu(x)
        x = torch.randn(256, 2048, device="cuda")
        cf = kiln.compile(f, mode="max-autotune-no-cudagraphs")
        err = (cf(x) - f(x)).abs().max().item()
        s = kiln.stats()
        print(json.dumps({"timed": s["kernels_autotuned"], "hits": s["autotune_cache_hits"], "err": err}))
    """
    first = child_result(run_child(code, tmp_path))
    second = child_result(run_child(code, tmp_path))
    assert first["timed"] >= 1 and first["hits"] == 0, first
    assert second["timed"] == 0 and second["hits"] == first["timed"], second
    assert first["err"] < 1e-5 and second["err"] < 1e-5


def test_options_max_autotune_tunes_as_the_mode_does(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    kiln.reset()
    cf = kiln.compile(lambda x: torch.softmax(x, -1) * 2, options={"max_autotune": True})
    x = torch.randn(512, 1000, device="cuda")
    assert_same(cf(x), torch.softmax(x, -1) * 2, rtol=1e-5, atol=1e-6)
    assert _tuning()[0] >= 1
    assert kiln.stats()["cudagraph_recordings"] == 0  # no "triton.cudagraphs": no CUDA graphs


def test_default_mode_times_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    kiln.reset()
    cf = kiln.compile(lambda x: torch.softmax(x, -1) * 2)
    x = torch.randn(512, 1000, device="cuda")
    assert_same(cf(x), torch.softmax(x, -1) * 2, rtol=1e-5, atol=1e-6)
    assert _tuning() == (0, 0)
    assert all("autotuned" not in k.launch for k in kiln.explain(cf)(x).kernels)


def test_shape_generic_graphs_keep_their_launches(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    kiln.reset()
    cf = kiln.compile(lambda x: torch.softmax(x, -1) * 2, mode="max-autotune-no-cudagraphs", dynamic=True)
    for n in (100, 300, 700):
        x = torch.randn(n, 1000, device="cuda")
        assert_same(cf(x), torch.softmax(x, -1) * 2, rtol=1e-5, atol=1e-6)
    assert _tuning() == (0, 0)
