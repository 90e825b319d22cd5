"""Helpers for comparing kiln against eager PyTorch.

``check(fn, *args)`` is the one entry point the op tests use. It

1. asks ``kiln.explain`` whether ``fn`` is captured as exactly one graph with no break, so a
   test cannot pass by quietly running eagerly;
2. runs ``kiln.compile(fn)`` on copies of ``args`` and compares with eager ``fn(*args)``:
   same structure, shapes, dtypes and devices, values within tolerance, and the inputs left
   as eager leaves them;
3. calls the same compiled function again with new random values laid out exactly like
   ``args`` (same sizes, strides, storage offset, dtype), which must reuse the compiled code
   (no recompile) and still match eager;
4. checks kiln's counters: no eager fallback during either compiled call.
"""
from __future__ import annotations

import faulthandler
import math
import os
import select
import signal
import time
import traceback

import torch

import kiln

# Tolerances for floating outputs when the caller does not give any: torch.testing's defaults.
_DEFAULT_TOL = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
}


def _same_layout(t: torch.Tensor, *, fresh: bool) -> torch.Tensor:
    """A tensor with t's size, stride, storage offset, dtype and device, on a storage of its
    own. Its storage holds a copy of t's storage or, with fresh=True, new values drawn from
    t's own: a random permutation of the storage, floats also scaled by a factor in
    [0.75, 1.25]. That keeps the value domain (positive stays positive, no new zeros) while
    changing the values, and keeps non-contiguous and expanded layouts as they are."""
    n = t.untyped_storage().nbytes() // t.element_size()
    flat = t.new_empty(0).set_(t.untyped_storage(), 0, (n,), (1,)).detach().clone()
    if fresh and n > 0:
        flat = flat[torch.randperm(n, device=t.device)]
        if flat.is_floating_point():
            flat = flat * torch.empty_like(flat).uniform_(0.75, 1.25)
    return flat.as_strided(t.size(), t.stride(), t.storage_offset())


def _copy_args(args, *, fresh: bool = False):
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(_same_layout(a, fresh=fresh))
        elif isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a):
            out.append(type(a)(_copy_args(a, fresh=fresh)))
        else:
            out.append(a)
    return tuple(out)


def _tol(dtype, rtol, atol):
    if dtype not in _DEFAULT_TOL:
        return 0.0, 0.0  # integers and bool compare exactly
    d_rtol, d_atol = _DEFAULT_TOL[dtype]
    if dtype == torch.float64 or (rtol is None and atol is None):
        return d_rtol, d_atol
    return (rtol if rtol is not None else d_rtol), (atol if atol is not None else d_atol)


def assert_same(actual, expected, *, rtol=None, atol=None, path="out"):
    """Structure, type, shape, dtype, device and values of actual equal expected's."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: expected a Tensor, kiln returned {type(actual).__name__}"
        assert actual.shape == expected.shape, f"{path}: shape {tuple(actual.shape)} != eager {tuple(expected.shape)}"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != eager {expected.dtype}"
        assert actual.device == expected.device, f"{path}: device {actual.device} != eager {expected.device}"
        r, a = _tol(expected.dtype, rtol, atol)
        torch.testing.assert_close(actual, expected, rtol=r, atol=a, equal_nan=True,
                                   msg=lambda m: f"{path}: {m}")
    elif isinstance(expected, (tuple, list)):
        assert type(actual) is type(expected), f"{path}: {type(actual).__name__} != eager {type(expected).__name__}"
        assert len(actual) == len(expected), f"{path}: {len(actual)} items != eager {len(expected)}"
        for i, (x, y) in enumerate(zip(actual, expected)):
            assert_same(x, y, rtol=rtol, atol=atol, path=f"{path}[{i}]")
    elif isinstance(expected, float):
        assert isinstance(actual, float), f"{path}: {type(actual).__name__} != eager float"
        assert math.isclose(actual, expected, rel_tol=rtol or 1e-6, abs_tol=atol or 1e-6) or (
            math.isnan(actual) and math.isnan(expected)), f"{path}: {actual} != eager {expected}"
    else:
        assert type(actual) is type(expected) and actual == expected, f"{path}: {actual!r} != eager {expected!r}"


def check(fn, *args, rtol=None, atol=None, isolate=False):
    """Compile fn with kiln, require one graph with no fallback, and compare two calls (the
    first compiles, the second reuses the code on new values) with eager PyTorch.

    isolate=True runs all of it in a forked child process, so that a crash inside kiln (a
    segfault in generated code) fails this one test instead of killing the whole session. CUDA
    does not survive fork(), so checks with CUDA tensors always run in-process."""
    on_cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    if isolate and not on_cuda:
        return run_forked(check, fn, *args, rtol=rtol, atol=atol)
    # 1. kiln must capture the whole function as one graph.
    explained = kiln.explain(fn)(*_copy_args(args))
    assert not explained.break_reasons, (
        "kiln fell back to eager: "
        + "; ".join(f"{r['reason']} (at {r['location']})" for r in explained.break_reasons))
    # No graph at all is right only when there is nothing to compute (x.float() of a float).
    assert explained.graph_count == 1 or (explained.graph_count == 0 and explained.op_count == 0), (
        f"expected one graph, got {explained.graph_count}\n{explained}")

    compiled = kiln.compile(fn)
    before = kiln.stats()

    # 2. First call: compiles.
    eager_args = _copy_args(args)
    kiln_args = _copy_args(args)
    expected = fn(*eager_args)
    actual = compiled(*kiln_args)
    assert_same(actual, expected, rtol=rtol, atol=atol)
    assert_same(kiln_args, eager_args, path="inputs after the call")

    middle = kiln.stats()

    # 3. Second call, new values of the same layout: the compiled code is reused.
    fresh = _copy_args(args, fresh=True)
    eager_args = _copy_args(fresh)
    expected = fn(*eager_args)
    actual = compiled(*fresh)
    assert_same(actual, expected, rtol=rtol, atol=atol, path="out (second call)")
    assert_same(fresh, eager_args, path="inputs after the second call")

    after = kiln.stats()

    # 4. Counters: nothing ran eagerly; the second call did not recompile.
    fallbacks = after["eager_fallbacks"] - before["eager_fallbacks"]
    assert fallbacks == 0, f"{fallbacks} eager fallback(s): {after['fallback_reasons']}"
    assert after["recompiles"] == middle["recompiles"], "second call with the same layout recompiled"
    assert after["graphs_compiled"] == middle["graphs_compiled"], "second call with the same layout compiled a new graph"
    return actual


def run_forked(func, *args, timeout=120.0, **kwargs):
    """Run func(*args, **kwargs) in a forked child; raise AssertionError in the parent if it
    raised, died of a signal or ran past timeout seconds. Returns None (results stay in the
    child). The child runs single-threaded: OpenMP's thread pool does not survive fork()."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        code, msg = 0, b""
        try:
            faulthandler.disable()  # the parent reports the crash; no second traceback
            torch.set_num_threads(1)
            func(*args, **kwargs)
        except BaseException:  # noqa: BLE001  (everything goes back to the parent)
            code, msg = 1, traceback.format_exc().encode()
        try:
            view = memoryview(msg)
            while view:
                view = view[os.write(w, view):]
        finally:
            os._exit(code)
    os.close(w)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise AssertionError(f"forked check ran past {timeout} s (hang?) and was killed")
            ready, _, _ = select.select([r], [], [], min(left, 1.0))
            if ready:
                data = os.read(r, 65536)
                if not data:
                    break
                chunks.append(data)
    finally:
        os.close(r)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status)).name
        raise AssertionError(f"kiln crashed the process with {sig}")
    if os.WEXITSTATUS(status) != 0:
        raise AssertionError("in the forked child:\n" + b"".join(chunks).decode(errors="replace"))
