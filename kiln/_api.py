"""The user-facing API. Argument checking and result shaping only; no compiler logic."""
from __future__ import annotations

import os
import copy
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.nn.modules import module as _torch_module

_NVRTC_DIRS_SET = False


def _find_nvrtc_dirs() -> None:
    # NVRTC ships inside the nvidia-* wheels that CUDA builds of torch depend on; tell the C++
    # loader where they are (it also tries the system's libnvrtc).
    global _NVRTC_DIRS_SET
    if _NVRTC_DIRS_SET or os.environ.get("KILN_NVRTC_DIRS"):
        return
    _NVRTC_DIRS_SET = True
    dirs = []
    for entry in sys.path:
        for sub in ("nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"):
            d = os.path.join(entry, sub)
            if os.path.isdir(d):
                dirs.append(d)
    if dirs:
        os.environ["KILN_NVRTC_DIRS"] = ":".join(dirs)


_find_nvrtc_dirs()
from . import _C  # noqa: E402  (after the environment the loader reads is set)

_MODES = ("default", "lite", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# kiln's own options, next to torch.compile's (torch._inductor.config's keys).
_KILN_OPTIONS = {"cache_limit": int}


def _check_options(options: dict) -> None:
    # What torch.compile checks, with its messages: every key is an inductor config option and
    # its value has that option's type.
    from torch._inductor import config as inductor_config
    known = inductor_config.get_config_copy()
    for key, value in options.items():
        name = key.replace("-", "_")
        if name in _KILN_OPTIONS:
            if not isinstance(value, _KILN_OPTIONS[name]) or isinstance(value, bool):
                raise RuntimeError(f"Unexpected type of attr {key}, got {type(value).__name__} should be "
                                   f"{_KILN_OPTIONS[name].__name__}")
            continue
        if name not in known:
            raise RuntimeError(f"Unexpected optimization option {key}, known options are {list(known.keys())}")
        if type(value) is not type(known[name]):
            raise RuntimeError(f"Unexpected type of attr {key}, got {type(value).__name__} should be "
                               f"{type(known[name]).__name__}")


def _mode_of_options(options: dict) -> str:
    # The inductor options a mode stands for (torch._inductor.list_mode_options): autotuning,
    # CUDA graphs, or both.
    tune = any(options.get(k) for k in ("max_autotune", "max_autotune_pointwise", "max_autotune_gemm"))
    graphs = bool(options.get("triton.cudagraphs"))
    if tune:
        return "max-autotune" if graphs else "max-autotune-no-cudagraphs"
    return "reduce-overhead" if graphs else "default"


class CompiledModule(torch.nn.Module):
    """An nn.Module whose forward runs through kiln. Parameters and buffers stay those of the
    wrapped module, read at every call (never baked into the compiled code)."""

    def __init__(self, module: torch.nn.Module, compiled_forward, compiled_call):
        super().__init__()
        self._orig_mod = module
        self._kiln_forward = compiled_forward
        self._kiln_call = compiled_call

    def forward(self, *args, **kwargs):
        m = self._orig_mod
        if _has_hooks(m):
            # Hooks run as nn.Module.__call__ runs them, captured with the forward.
            return self._kiln_call(m, *args, **kwargs)
        return self._kiln_forward(m, *args, **kwargs)

    def __getattr__(self, name):
        if name in ("_orig_mod", "_kiln_forward", "_kiln_call", "_kiln_args"):
            return super().__getattr__(name)
        return getattr(self._orig_mod, name)

    def __setattr__(self, name, value):
        # an attribute set on the compiled module is set on the module it runs (c.step = 20
        # reaches m.step, as torch.compile's wrapper forwards it)
        if name in ("_orig_mod", "_kiln_forward", "_kiln_call", "_kiln_args", "training") or "_orig_mod" not in self.__dict__.get("_modules", {}):
            super().__setattr__(name, value)
        else:
            setattr(self._orig_mod, name, value)

    # `training` is the wrapped module's, as torch.compile's wrapper has it: mod.eval() shows in
    # compiled.training, and compiled.train() reaches mod (nn.Module.__init__ sets the flag
    # before the module is there: ignored).
    @property
    def training(self):
        mod = self.__dict__.get("_modules", {}).get("_orig_mod")
        return mod.training if mod is not None else True

    @training.setter
    def training(self, value):
        mod = self.__dict__.get("_modules", {}).get("_orig_mod")
        if mod is not None:
            mod.training = value

    def __reduce__(self):
        # torch.save / pickle: the module, compiled again with the same keywords where loaded
        # (compiled code is not pickled; the disk cache serves it)
        return (_compile_again, (self._orig_mod, self.__dict__.get("_kiln_args", {})))

    def __deepcopy__(self, memo):
        # a copy of the module, run through the same compiled functions (their guards tell the
        # modules apart): the compiled code is not copied
        clone = type(self).__new__(type(self))
        memo[id(self)] = clone
        torch.nn.Module.__init__(clone)
        clone._orig_mod = copy.deepcopy(self._orig_mod, memo)
        clone._kiln_forward = self._kiln_forward
        clone._kiln_call = self._kiln_call
        if "_kiln_args" in self.__dict__:
            clone._kiln_args = self._kiln_args
        return clone


class CompiledDataParallel(CompiledModule):
    """``kiln.compile(DistributedDataParallel(model))``: DDP's own forward runs as it is (its
    bucket bookkeeping and hooks are torch's), and the module it wraps runs through kiln, as
    torch.compile runs DDP (Dynamo skips DDP's forward and compiles the wrapped module's). The
    wrapped module's ``forward`` is kiln's only while DDP runs it; the model is left as it was."""

    def forward(self, *args, **kwargs):
        ddp = self._orig_mod
        inner = ddp.module
        if "forward" in inner.__dict__:  # the user's own per-instance forward runs as given
            return ddp(*args, **kwargs)
        inner.forward = types.MethodType(self._kiln_forward, inner)
        try:
            return ddp(*args, **kwargs)
        finally:
            del inner.forward


def _data_parallel_type():
    # DistributedDataParallel, if torch.distributed is in use (importing it costs ~100 ms)
    mod = sys.modules.get("torch.nn.parallel.distributed")
    return getattr(mod, "DistributedDataParallel", None)


def _global_hooks() -> bool:
    return bool(_torch_module._global_forward_hooks or _torch_module._global_forward_pre_hooks or
                _torch_module._global_backward_hooks or _torch_module._global_backward_pre_hooks)


def _has_hooks(m: torch.nn.Module) -> bool:
    # Called as `m(...)` is, not through its class's forward: a module with hooks (forward hooks
    # are captured with the forward; backward hooks leave the call to Python, where they fire),
    # a forward set on the instance, or a class with a __call__ of its own.
    return bool(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks or
                _global_hooks() or "forward" in m.__dict__ or type(m).__call__ is not torch.nn.Module.__call__)


def _compile_again(module, kwargs):
    return compile(module, **kwargs)


def _call_module(module, *args, **kwargs):
    return module(*args, **kwargs)


def compile(
    model: Callable | None = None,
    *,
    mode: str | None = None,
    fullgraph: bool = False,
    dynamic: bool | None = None,
    backend: str | Callable = "inductor",
    options: dict[str, Any] | None = None,
    disable: bool = False,
):
    """Compile a function or nn.Module. Same keywords as torch.compile.

    Usable as ``kiln.compile(f)``, ``@kiln.compile`` and ``@kiln.compile(mode=...)``.

    ``backend="inductor"`` (the default) compiles captured graphs into kernels; ``backend="eager"``
    captures the same way (guards, cache, recompiles, graph breaks) and runs each graph through
    torch's own ops, as ``torch.compile(backend="eager")`` does; ``"aot_eager"`` is ``"eager"``
    (the same results for inference). Other torch backends, and callable backends (which take an
    FX GraphModule), raise.
    """
    if model is None:
        def decorator(fn):
            return compile(fn, mode=mode, fullgraph=fullgraph, dynamic=dynamic, backend=backend,
                           options=options, disable=disable)
        return decorator
    if not callable(model):
        # torch.compile's own check and message
        raise AssertionError(f"A callable function is expected, but {type(model)} is provided.")
    if mode is not None and options is not None:
        raise RuntimeError("Either mode or options can be specified, but both can't be specified at the same time.")
    mode = mode or "default"
    if options is not None and not isinstance(options, dict):
        raise TypeError("options must be a dict")
    backend = _backend(backend)
    if backend == "inductor":
        if mode not in _MODES:
            raise RuntimeError(f"Unrecognized mode={mode}, should be one of: {', '.join(_MODES)}")
        _check_options(options or {})
    elif options and "cache_limit" in options:
        # torch's other backends take any mode and options (its eager backend ignores them);
        # kiln's own cache_limit still applies.
        _check_options({"cache_limit": options["cache_limit"]})
    if options:
        mode = _mode_of_options(options)
    limit = int((options or {}).get("cache_limit", 8))
    if backend != "inductor":
        mode = "default"  # as torch's eager backend, which ignores mode

    def make(fn):
        return _C.compile(fn, mode, fullgraph, disable, limit, backend, dynamic)

    ddp = _data_parallel_type()
    if ddp is not None and isinstance(model, ddp):
        return CompiledDataParallel(model, make(type(model.module).forward), None)
    if isinstance(model, torch.nn.Module):
        compiled = CompiledModule(model, make(type(model).forward), make(_call_module))
        compiled._kiln_args = dict(mode=None if options else mode, fullgraph=fullgraph, dynamic=dynamic,
                                   backend=backend, options=options, disable=disable)
        return compiled
    if isinstance(model, types.MethodType):
        # A bound method: compile the function, bind the same receiver.
        return types.MethodType(make(model.__func__), model.__self__)
    return make(model)


# torch.compile's backend names kiln implements, and what kiln runs for each. "aot_eager" traces
# through AOTAutograd into the same aten ops and runs them eagerly: for inference (kiln captures
# no backward graphs) that is "eager".
_BACKENDS = {"inductor": "inductor", "eager": "eager", "aot_eager": "eager"}


def _backend(backend) -> str:
    if isinstance(backend, str):
        if backend in _BACKENDS:
            return _BACKENDS[backend]
        # torch's own check and exception (torch._dynamo.exc.InvalidBackend) for a name it does not know
        from torch._dynamo.backends.registry import lookup_backend
        lookup_backend(backend)
        raise NotImplementedError(
            f"kiln.compile: backend={backend!r} is a torch.compile backend kiln does not implement; "
            f"kiln runs {', '.join(map(repr, _BACKENDS))}")
    if callable(backend):
        # torch.compile hands a callable backend a torch.fx.GraphModule and example inputs; kiln's
        # graphs are its own IR, not FX, so there is nothing to hand it.
        raise NotImplementedError(
            f"kiln.compile: a callable backend ({getattr(backend, '__name__', type(backend).__name__)}) takes a "
            "torch.fx.GraphModule, and kiln's captured graphs are not FX graphs; use backend='inductor' "
            "(kiln's compiler) or backend='eager' (kiln's capture, torch's ops), or torch.compile itself")
    raise TypeError(f"kiln.compile: backend must be a str or a callable, not {type(backend).__name__}")


@dataclass
class ExplainOutput:
    """What kiln made of one call: graphs, ops, guards, kernels and why anything fell back."""
    graph_count: int
    graph_break_count: int
    op_count: int
    break_reasons: list = field(default_factory=list)
    graphs: list = field(default_factory=list)
    guards: list = field(default_factory=list)
    kernels: list = field(default_factory=list)
    loop_ir: str = ""
    source_path: str = ""
    compile_seconds: float = 0.0
    # Every graph as capture made it, before any pass: also those of frames that then ran
    # eagerly because compiling them failed.
    captured: str = ""
    # mode="reduce-overhead": per graph, whether it is recorded as a CUDA graph, or why not.
    cudagraphs: list = field(default_factory=list)
    # Graphs with results autograd tracks (training): per graph, its backward program as a dict
    # with "graph" (after passes), "saved" (how many values the forward keeps for it) and
    # "source"; and the backward's kernel names.
    backward_graphs: list = field(default_factory=list)
    backward_kernels: list = field(default_factory=list)
    # Per graph that has one, what it computes from parameters and buffers alone (folded
    # batch norms, weight layouts), run once and again only when one of them changes: a dict
    # with "graph" and "kernels".
    prologues: list = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"Graph Count: {self.graph_count}", f"Graph Break Count: {self.graph_break_count}",
                 f"Op Count: {self.op_count}"]
        if self.break_reasons:
            lines.append("Break Reasons:")
            for r in self.break_reasons:
                lines.append(f"  {r['reason']} (at {r['location']})")
        for i, g in enumerate(self.graphs):
            lines.append(f"Graph {i}:")
            lines.append(g.rstrip())
        for i, p in enumerate(self.prologues):
            lines.append(f"Prologue {i} (from parameters and buffers, kept until one changes):")
            lines.append(p["graph"].rstrip())
        for i, b in enumerate(self.backward_graphs):
            lines.append(f"Backward graph {i} (reads {b['saved']} saved values):")
            lines.append(b["graph"].rstrip())
        lines.append(f"Guards ({len(self.guards)}):")
        lines.extend("  " + g for g in self.guards)
        lines.append(f"Kernels ({len(self.kernels)}):")
        for k in self.kernels:
            lines.append(f"  {k['name']}")
        if self.backward_kernels:
            lines.append(f"Backward kernels ({len(self.backward_kernels)}):")
            lines.extend("  " + k for k in self.backward_kernels)
        if self.source_path:
            lines.append(f"Generated code: {self.source_path}")
        return "\n".join(lines)


def explain(fn: Callable, *extra_args, **extra_kwargs):
    """``kiln.explain(fn)(*args, **kwargs)`` captures and compiles one call afresh and returns
    an ExplainOutput. For a function kiln.compile returned, with that function's backend (the
    eager backend shows its graphs and no kernels)."""
    like = None  # a compiled function whose backend and mode explain uses
    if isinstance(fn, CompiledModule):
        like = fn._kiln_forward
        fn = fn._orig_mod.module if isinstance(fn, CompiledDataParallel) else fn._orig_mod
    if isinstance(fn, torch.nn.Module):
        module, target = fn, (_call_module if _has_hooks(fn) else type(fn).forward)
    elif isinstance(fn, types.MethodType):
        module, target = fn.__self__, fn.__func__
    else:
        module, target = None, fn
    if _C.is_compiled(target):
        like = target
        target = _C.target(target)

    def run(*args, **kwargs):
        call_args = (module,) + args if module is not None else args
        d = _C.explain(target, tuple(call_args), dict(kwargs), like)
        return ExplainOutput(
            graph_count=d["graph_count"], graph_break_count=d["graph_break_count"], op_count=d["op_count"],
            break_reasons=list(d["break_reasons"]), graphs=list(d["graphs"]), guards=list(d["guards"]),
            kernels=[_Kernel(k["name"], k["source"], k.get("launch", "")) for k in d["kernels"]], loop_ir=d.get("loop_ir", ""),
            source_path=d.get("source_path", ""), compile_seconds=d.get("compile_seconds", 0.0),
            captured=d.get("captured", ""), cudagraphs=list(d.get("cudagraphs", [])),
            backward_graphs=list(d.get("backward_graphs", [])), backward_kernels=list(d.get("backward_kernels", [])),
            prologues=list(d.get("prologues", [])))

    if extra_args or extra_kwargs:
        return run(*extra_args, **extra_kwargs)
    return run


class _Kernel(dict):
    """A generated kernel: ``k.name``, ``k.source``, and for a CUDA kernel ``k.launch`` (grid,
    block, and whether max-autotune chose them); also readable as a dict."""

    def __init__(self, name: str, source: str, launch: str = ""):
        super().__init__(name=name, source=source, launch=launch)
        self.name = name
        self.source = source
        self.launch = launch

    def __str__(self) -> str:
        return self.source


def reset() -> None:
    """Clear every in-memory cache of compiled code and the counters (the disk cache stays)."""
    _C.reset()


def stats() -> dict:
    """Counters: frames captured, graphs compiled, graph breaks, recompiles (with the guard
    that failed, last 64), cache hits in memory and on disk, eager fallbacks and breaks with
    their reasons, kernels generated."""
    return dict(_C.stats())


def cache_dir() -> str:
    """Where compiled kernels are cached on disk (KILN_CACHE_DIR overrides)."""
    return _C.cache_dir()
