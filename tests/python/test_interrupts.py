"""Ctrl-C and killed processes during a compile (issue 10): a KeyboardInterrupt raised while
kiln captures or compiles reaches the caller and leaves the function compilable (the next call
compiles; nothing eager is cached), the C++ compiler it interrupts is killed, and temporary
files of processes killed mid-compile are swept from the shared cache by the next process."""
import dis
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import kiln
from _process import child_env, child_result, run_child

# A C++ compiler that takes forever the first time it is asked to compile (until $KILN_TEST_MARK
# exists), and is the real one otherwise. It writes its pid to the mark, so that tests can see
# whether it still runs.
SLOW_CXX = """#!/bin/sh
case " $* " in *" --version "*) exec c++ "$@";; esac
if [ ! -s "$KILN_TEST_MARK" ]; then
  echo $$ > "$KILN_TEST_MARK"
  sleep 600
fi
exec c++ "$@"
"""


def slow_cxx(tmp_path):
    path = tmp_path / "slow-cxx"
    path.write_text(SLOW_CXX)
    path.chmod(0o755)
    return path


def running(pgid: int) -> list[int]:
    """Processes of process group `pgid` that still run (zombies excluded)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(name))
    return out


def temporaries(cache_dir) -> list[str]:
    d = cache_dir / "cpu"
    return sorted(n for n in os.listdir(d) if ".tmp-" in n) if d.exists() else []


@pytest.fixture(autouse=True)
def python_sigint_handler():
    # A process started in the background by a non-interactive shell inherits SIGINT ignored,
    # and Python then installs no handler of its own: Ctrl-C would never reach these tests.
    old = signal.getsignal(signal.SIGINT)
    if old == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def test_keyboard_interrupt_during_capture_propagates_and_next_call_compiles(monkeypatch):
    # Ctrl-C while capture runs Python code (here: decoding the bytecode with dis): Python's
    # handler raises KeyboardInterrupt inside a call whose errors capture otherwise clears.
    real = dis.get_instructions
    calls = []

    def interrupted_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            signal.raise_signal(signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(dis, "get_instructions", interrupted_once)

    def f(x):
        return torch.relu(x) * 3 + 1

    kiln.reset()
    g = kiln.compile(f)
    x = torch.randn(16)
    try:
        g(x)
        raised = False
    except KeyboardInterrupt:
        raised = True
    assert raised, f"calls={calls} stats={kiln.stats()} handler={signal.getsignal(signal.SIGINT)}"
    assert calls, "capture did not decode the function"
    assert kiln.stats()["graphs_compiled"] == 0
    torch.testing.assert_close(g(x), f(x))
    s = kiln.stats()
    assert s["graphs_compiled"] == 1
    assert s["eager_fallbacks"] == 0
    assert s["recompiles"] == 0
    torch.testing.assert_close(g(x), f(x))
    assert kiln.stats()["cache_hits_memory"] >= 1


CHILD_INTERRUPTED_COMPILE = """
    import json, os, signal, threading, time, torch, kiln
    mark = os.environ["KILN_TEST_MARK"]
    handler = os.environ.get("HANDLER")
    seen = []
    if handler == "ignore":  # a program's own handler that does not raise
        signal.signal(signal.SIGINT, lambda *a: seen.append("SIGINT"))

    def interrupt_when_the_compiler_runs():
        while not (os.path.exists(mark) and open(mark).read().strip()):
            time.sleep(0.02)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGINT)  # as a notebook's interrupt does

    def f(x):
        return torch.sin(x) * 2 + 1

    def close(a, b):  # float32's tolerance: kiln's sin and torch's differ in the last bit
        return bool(torch.allclose(a, b, rtol=1.3e-6, atol=1e-5))

    g = kiln.compile(f)
    x = torch.randn(64)
    threading.Thread(target=interrupt_when_the_compiler_runs, daemon=True).start()
    t0 = time.monotonic()
    try:
        y = g(x)
        first = "returned"
        first_ok = close(y, f(x))
    except KeyboardInterrupt:
        first = "KeyboardInterrupt"
        first_ok = None
    took = time.monotonic() - t0
    compiler = int(open(mark).read())
    after_first = dict(kiln.stats())
    tmp_after_first = sorted(n for n in os.listdir(os.path.join(os.environ["KILN_CACHE_DIR"], "cpu")) if ".tmp-" in n)
    y = g(x)
    second_ok = close(y, f(x))
    s = kiln.stats()
    e = kiln.explain(f)(x)
    print(json.dumps({"first": first, "first_ok": first_ok, "took": took, "compiler": compiler,
                      "compiled_after_first": after_first["graphs_compiled"],
                      "fallbacks_after_first": after_first["eager_fallbacks"], "tmp_after_first": tmp_after_first,
                      "second_ok": second_ok, "graphs_compiled": s["graphs_compiled"],
                      "eager_fallbacks": s["eager_fallbacks"], "recompiles": s["recompiles"],
                      "explain_graphs": e.graph_count, "seen": seen}))
"""


def test_keyboard_interrupt_during_cpp_compile_kills_compiler_and_next_call_compiles(tmp_path):
    cache = tmp_path / "cache"
    mark = tmp_path / "mark"
    proc = run_child(CHILD_INTERRUPTED_COMPILE, cache,
                     {"KILN_CXX": str(slow_cxx(tmp_path)), "KILN_TEST_MARK": str(mark)})
    out = child_result(proc)
    assert out["first"] == "KeyboardInterrupt", out
    # The compiler (sleeping for 600 s) was stopped at once, with everything it started.
    assert out["took"] < 30, out
    assert running(out["compiler"]) == []
    assert out["compiled_after_first"] == 0 and out["fallbacks_after_first"] == 0, out
    assert out["tmp_after_first"] == [], out
    # The next call compiles normally: no eager entry was cached.
    assert out["second_ok"], (out, proc.stderr[-3000:])
    assert out["graphs_compiled"] == 1, out
    assert out["eager_fallbacks"] == 0, out
    assert out["recompiles"] == 0, out
    assert out["explain_graphs"] == 1, out


def test_sigint_handler_that_does_not_raise_lets_the_compile_finish(tmp_path):
    cache = tmp_path / "cache"
    mark = tmp_path / "mark"
    proc = run_child(CHILD_INTERRUPTED_COMPILE, cache,
                     {"KILN_CXX": str(slow_cxx(tmp_path)), "KILN_TEST_MARK": str(mark), "HANDLER": "ignore"})
    out = child_result(proc)
    # The program's handler ran and chose to go on: so does the call, compiled.
    assert out["seen"] == ["SIGINT"], out
    assert out["first"] == "returned" and out["first_ok"], out
    assert out["took"] < 120, out
    assert running(out["compiler"]) == []
    assert out["compiled_after_first"] == 1 and out["fallbacks_after_first"] == 0, out
    assert out["graphs_compiled"] == 1 and out["eager_fallbacks"] == 0, out


CHILD_COMPILES = """
    import json, torch, kiln
    f = kiln.compile(lambda x: torch.cos(x) - {k})
    print(json.dumps({{"ok": bool(torch.allclose(f(torch.ones(4)), torch.cos(torch.ones(4)) - {k}, rtol=1.3e-6, atol=1e-5))}}))
"""


def start_slow_compile(tmp_path, cache, name):
    """A child compiling with the slow compiler, in a session of its own; returns once the
    compiler runs (its temporary .so then exists)."""
    mark = tmp_path / f"mark-{name}"
    code = textwrap.dedent(CHILD_COMPILES.format(k=len(name)))
    env = child_env(cache, {"KILN_CXX": str(slow_cxx(tmp_path)), "KILN_TEST_MARK": str(mark)})
    p = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not (mark.exists() and mark.read_text().strip()):
        assert p.poll() is None, f"child {name} ended before compiling"
        assert time.monotonic() < deadline, f"child {name} never started its compiler"
        time.sleep(0.05)
    return p, int(mark.read_text())


def kill_group(pgid: int):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_temporaries_of_a_killed_compile_are_swept_and_a_live_ones_kept(tmp_path):
    cache = tmp_path / "cache"
    killed, killed_cxx = start_slow_compile(tmp_path, cache, "killed")
    live, live_cxx = start_slow_compile(tmp_path, cache, "live")
    try:
        def of(p):
            return [n for n in temporaries(cache) if f"-{p.pid}-" in n]

        assert of(killed) and of(live), temporaries(cache)
        # SIGKILL mid-compile: the process and its session go; its compiler, a process group of
        # its own, would go on to finish on its own; here it goes too.
        kill_group(killed.pid)
        killed.wait(timeout=60)
        kill_group(killed_cxx)
        assert of(killed), "the killed compile left no temporary (nothing to test)"
        # The next process that opens the cache sweeps what the dead one left, and leaves the
        # temporaries of the live one alone (it still renames them into place).
        out = child_result(run_child(CHILD_COMPILES.format(k=1), cache))
        assert out["ok"]
        assert of(killed) == []
        assert of(live), temporaries(cache)
    finally:
        for p, cxx in ((killed, killed_cxx), (live, live_cxx)):
            kill_group(p.pid)
            kill_group(cxx)
            p.wait(timeout=60)
