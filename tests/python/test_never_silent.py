"""Never silent (issue 10, part 5): a call that runs entirely eagerly warns once per function with
the reason, kiln.stats() counts every such call and every recompile, recompile reasons name the
guard that failed on each cached entry, and torch.compile's mode/options/backend keywords
behave as torch.compile's."""
import warnings

import pytest
import torch

import kiln


def not_rebuildable(x, w):
    # A bound method of a tensor in the result: kiln cannot rebuild it, so the call runs eagerly.
    return (x * w).sum(), x.register_hook


def test_a_call_that_runs_eagerly_warns_once_with_the_reason():
    w = torch.randn(4)
    cf = kiln.compile(not_rebuildable)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            x = torch.randn(4)
            torch.testing.assert_close(cf(x, w)[0], not_rebuildable(x, w)[0])
    mine = [w for w in caught if "kiln" in str(w.message) and "runs eagerly" in str(w.message)]
    assert len(mine) == 1, [str(w.message) for w in caught]
    assert "cannot rebuild" in str(mine[0].message)


def test_suppress_fallback_warnings_silences_them():
    fn = not_rebuildable
    w = torch.randn(3)
    kiln.config.suppress_fallback_warnings = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            kiln.compile(fn)(torch.randn(3), w)
    finally:
        kiln.config.suppress_fallback_warnings = False


def test_every_eager_call_is_counted():
    fn = not_rebuildable
    w = torch.randn(3)
    cf = kiln.compile(fn)
    before = kiln.stats()["eager_fallbacks"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(4):
            cf(torch.randn(3), w)
    assert kiln.stats()["eager_fallbacks"] - before == 4


def test_a_users_shape_error_is_raised_not_counted_as_a_fallback():
    cf = kiln.compile(lambda a, b: a + b)
    before = kiln.stats()["eager_fallbacks"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "runs eagerly" warning either
        with pytest.raises(RuntimeError, match="must match the size"):
            cf(torch.randn(3), torch.randn(4))
    assert kiln.stats()["eager_fallbacks"] == before


def test_cache_limit_counts_recompiles_consistently_and_names_each_entrys_failed_guard():
    def fn(x):
        return x * 2

    cf = kiln.compile(fn, dynamic=False, options={"cache_limit": 3})  # one entry per size
    before = kiln.stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(2, 7):
            x = torch.randn(n)
            torch.testing.assert_close(cf(x), fn(x))
    after = kiln.stats()
    assert after["recompiles"] - before["recompiles"] == 2  # 3 entries: the first compile and 2 recompiles
    limit = [str(w.message) for w in caught if "cache limit" in str(w.message)]
    assert len(limit) == 1, limit
    assert "3 entries" in limit[0] and "entry 0" in limit[0] and "entry 2" in limit[0]
    reasons = [r for r in after["recompile_reasons"] if r.startswith(fn.__qualname__)]
    assert reasons and "entry 0:" in reasons[-1] and "entry 1:" in reasons[-1], reasons
    # calls past the limit run eagerly, and each is counted
    assert after["eager_fallbacks"] - before["eager_fallbacks"] == 2


def test_unknown_option_raises_as_torch_compile():
    with pytest.raises(RuntimeError, match="Unexpected optimization option not_an_option, known options are"):
        kiln.compile(lambda x: x, options={"not_an_option": 1})
    with pytest.raises(RuntimeError, match="Unexpected type of attr max_autotune, got int should be bool"):
        kiln.compile(lambda x: x, options={"max_autotune": 1})
    kiln.compile(lambda x: x, options={"epilogue_fusion": True, "cache_limit": 4})


def test_mode_and_options_together_raise_as_torch_compile():
    with pytest.raises(RuntimeError, match="Either mode or options can be specified"):
        kiln.compile(lambda x: x, mode="default", options={"cache_limit": 2})


@pytest.mark.parametrize("mode", ["max-autotune", "max-autotune-no-cudagraphs"])
def test_max_autotune_modes_compile_without_a_warning(mode):
    # kiln implements both (the CUDA kernels' launches are timed; the CPU has nothing to tune).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f = kiln.compile(lambda x: x + 1, mode=mode)
        x = torch.randn(5)
        torch.testing.assert_close(f(x), x + 1)
    assert not [str(w.message) for w in caught if "kiln" in str(w.message)]


def test_reduce_overhead_is_implemented_and_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f = kiln.compile(lambda x: x + 1, mode="reduce-overhead")
        x = torch.randn(5)  # on the CPU the mode changes nothing, as torch.compile's
        torch.testing.assert_close(f(x), x + 1)
        torch.testing.assert_close(f(x), x + 1)


# ---- resources: code objects freed, the GIL released ----

def test_a_compiled_then_dropped_function_frees_its_code_object():
    import gc
    import weakref
    ns = {"torch": torch}
    exec(compile("def fn(t):\n    return (t * 3.0 + 1.0).relu()\n", "<kiln-test-drop>", "exec"), ns)
    fn = ns.pop("fn")
    code = weakref.ref(fn.__code__)
    cf = kiln.compile(fn)
    x = torch.randn(8)
    torch.testing.assert_close(cf(x), fn(x))
    del fn, cf
    gc.collect()
    assert code() is None, "kiln keeps the code object of a dropped compiled function alive"


def test_other_threads_run_while_a_kernel_runs():
    import threading
    import time

    def fn(x):
        for _ in range(8):
            x = torch.sin(x) * 1.0001 + torch.cos(x)
        return x

    cf = kiln.compile(fn)
    x = torch.randn(1 << 22)
    cf(x)  # compiled
    ticks, stop = [0], threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0)

    t = threading.Thread(target=spin)
    t.start()
    try:
        time.sleep(0.05)
        before = ticks[0]
        start = time.perf_counter()
        while time.perf_counter() - start < 0.5:
            cf(x)
        during = ticks[0] - before
    finally:
        stop.set()
        t.join()
    assert during > 100, f"the other thread ran {during} times in 0.5 s of kernels: the GIL was held"
