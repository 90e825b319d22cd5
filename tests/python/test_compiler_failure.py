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
