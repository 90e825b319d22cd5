"""kiln: a compiler for PyTorch programs with its engine in C++.

    model = kiln.compile(model)

The package is a thin shell: capture, guards, graph passes, lowering, scheduling, code
generation and the kernel cache all live in the C++ extension ``kiln._C``.
"""
from . import config, _eager_ops  # noqa: F401  (_eager_ops: found by path by the eager backend)
from ._api import compile, explain, reset, stats, cache_dir, ExplainOutput, CompiledModule
from . import _C, _polyfills

_polyfills.register(_C._register_polyfill)

__all__ = ["compile", "explain", "reset", "stats", "cache_dir", "config", "ExplainOutput", "CompiledModule"]
__version__ = "0.1.0"
