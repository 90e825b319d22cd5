"""Helpers shared by the API and runtime tests: kiln's counters, and child interpreters with
their own kernel cache (for what must be seen from a fresh process: disk cache hits, corrupt
entries, environment variables)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import kiln

KILN_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))

# The counters tests reason about (stats() also carries timings, which always move).
COUNTERS = ("frames_captured", "graphs_compiled", "recompiles", "cache_hits_memory",
            "cache_hits_disk", "eager_fallbacks", "kernels_generated")


def counters() -> dict:
    s = kiln.stats()
    return {k: s[k] for k in COUNTERS}


def delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in COUNTERS}


def child_env(cache_dir, extra_env: dict | None = None) -> dict:
    env = dict(os.environ)
    for var in ("KILN_DEBUG", "KILN_LOGS"):
        env.pop(var, None)
    env["PYTHONPATH"] = KILN_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["KILN_CACHE_DIR"] = str(cache_dir)
    if extra_env:
        env.update(extra_env)
    return env


def run_child(code: str, cache_dir, extra_env: dict | None = None, timeout: int = 300):
    """Runs `code` in a fresh interpreter with kiln importable and KILN_CACHE_DIR=cache_dir."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                          env=child_env(cache_dir, extra_env), capture_output=True, text=True,
                          timeout=timeout)


def child_result(proc) -> dict:
    """The JSON object a child printed on its last stdout line."""
    assert proc.returncode == 0, (
        f"child exited with {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
