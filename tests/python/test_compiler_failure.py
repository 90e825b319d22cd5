"""A failing C++ compiler must not break the program: the call runs eagerly and the
compiler's message reaches kiln.explain and the fallback log."""
import json
import os
import subprocess
import sys
import textwrap


def test_cxx_failure_falls_back_to_eager_with_the_message(tmp_path):
    fake = tmp_path / "fake-cxx"
    fake.write_text("#!/bin/sh\necho 'fake-cxx: internal compiler error: planted' >&2\nexit 1\n")
    fake.chmod(0o755)
    code = textwrap.dedent("""
        import json, torch, kiln
        f = lambda x: torch.sin(x) * 2 + 1
        x = torch.randn(16)
        torch.testing.assert_close(kiln.compile(f)(x), f(x))
        e = kiln.explain(f)(x)
        print(json.dumps({"graphs": e.graph_count, "reasons": [r["reason"] for r in e.break_reasons],
                          "fallbacks": kiln.stats()["eager_fallbacks"]}))
    """)
    env = dict(os.environ, KILN_CXX=str(fake), KILN_CACHE_DIR=str(tmp_path / "cache"), KILN_LOGS="fallback")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["graphs"] == 0
    assert "planted" in out["reasons"][0]
    assert out["fallbacks"] >= 1
    assert "planted" in r.stderr  # the fallback log names the compiler's message
    # Nothing was published in the cache: no artifact is left behind by the failed build.
    assert not list((tmp_path / "cache").rglob("*.so"))


def test_a_failing_unit_of_a_split_compile_falls_back_and_leaves_nothing(tmp_path):
    # The graph is compiled as two translation units (KILN_CPU_UNITS=2); the compiler fails on
    # the second one only. The call runs eagerly with the message, and neither the library nor
    # the first unit's object is left in the cache.
    fake = tmp_path / "fake-cxx"
    fake.write_text("#!/bin/sh\nfor a in \"$@\"; do case \"$a\" in *.1.cpp) "
                    "echo 'fake-cxx: planted failure in the second unit' >&2; exit 1;; esac; done\n"
                    "exec c++ \"$@\"\n")
    fake.chmod(0o755)
    code = textwrap.dedent("""
        import json, torch, kiln
        def f(x, y):
            return torch.sin(x).sum(1), torch.exp(y) * 2
        x, y = torch.randn(16, 9), torch.randn(50)
        out = kiln.compile(f)(x, y)
        torch.testing.assert_close(out, f(x, y))
        e = kiln.explain(f)(x, y)
        print(json.dumps({"graphs": e.graph_count, "reasons": [r["reason"] for r in e.break_reasons]}))
    """)
    env = dict(os.environ, KILN_CXX=str(fake), KILN_CACHE_DIR=str(tmp_path / "cache"), KILN_CPU_UNITS="2")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["graphs"] == 0 and "planted failure in the second unit" in out["reasons"][0], out
    assert not list((tmp_path / "cache").rglob("*.so")) and not list((tmp_path / "cache").rglob("*.o"))


def test_a_split_compile_equals_eager(tmp_path):
    code = textwrap.dedent("""
        import json, torch, kiln
        def f(x, y, a, b):
            return torch.sin(x).sum(1), torch.tanh(torch.exp(y)), torch.div(a, b, rounding_mode="floor"), x.cos() @ x.T
        args = (torch.randn(16, 9), torch.randn(50), torch.randint(-50, 50, (40,)), torch.randint(1, 5, (40,)))
        for _ in range(2):
            torch.testing.assert_close(kiln.compile(f)(*args), f(*args))
        b0 = args[3].clone(); b0[3] = 0
        try:  # torch's message for an integer division by zero, from a kernel of any unit
            kiln.compile(f)(args[0], args[1], args[2], b0)
            raised = False
        except RuntimeError as e:
            raised = "ZeroDivisionError" in str(e)
        e = kiln.explain(f)(*args)
        print(json.dumps({"graphs": e.graph_count, "raised": raised}))
    """)
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path / "cache"), KILN_CPU_UNITS="3")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["graphs"] == 1 and out["raised"], out
    units = {p.name.split(".")[1] for p in (tmp_path / "cache").rglob("*.cpp")}
    assert units == {"0", "1", "2"}, units  # the sources of the three units lie beside the library
    assert not list((tmp_path / "cache").rglob("*.o"))
