"""Differential fuzzing of kiln against eager PyTorch: a program generator and a runner.

Library code shared by ``tests/python/test_fuzz.py`` (a few hundred fixed seeds in CI) and
``bench/fuzz.py`` (thousands of seeds from the command line). Nothing here is a pytest test.

``generate(seed)`` builds a small random Python function as source text (1-8 statements over
1-3 tensor inputs) together with the specs of its inputs (shape, dtype, layout). The generator
runs every candidate statement eagerly on the program's own first input set, so it knows the
dtype and shape of every variable (type promotion, broadcasting, view rules all come from
torch itself) and keeps only statements that are valid; about one program in ten ends in a
statement chosen because it raises (dtype or shape errors), to compare kiln's exception with
eager's.

``check_program(program)`` runs the function eagerly and through ``kiln.compile`` on separate
copies of three input sets (the first one; fresh values of the same sizes and layouts; then
different sizes, which makes kiln recompile) and returns a list of ``Failure``s, one per
category and input set: see CATEGORIES.

The conditioning rule (``Conditioning``): floats are compared within TOL because kiln may round
a transcendental function, a reduction or a matmul differently in the last bits. Where the
program then amplifies such a difference past TOL (a remainder at a multiple of its divisor or
cancelling, a comparison of nearly equal values, a floor or cast at an integer, a divisor at
zero, a tie of +0.0 and -0.0 in a max), as found by watching eager's run of the same inputs,
those elements' values (or only their signs of zero) are not compared; everything else about
them (dtype, shape, strides, structure, exceptions) still is, and the Result counts what was
left out. With the eager backend (floats bit for bit) the rule is off.

``run_seeds(seeds, ...)`` checks seeds in child interpreters (``python _fuzz.py worker``), so
that a crash (segfault, abort, SIGFPE) or a hang ends one child, is reported against the seed
that was running, and the remaining seeds go on in a new child.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field

import torch

# kiln.compile's backend under test (KILN_FUZZ_BACKEND, inherited by the child interpreters).
# The eager backend runs torch's own ops, so its floating results must equal eager's exactly.
BACKEND = os.environ.get("KILN_FUZZ_BACKEND", "inductor")

# ---------------------------------------------------------------------------------------------
# Categories of failures
# ---------------------------------------------------------------------------------------------

CRASH = "crash"
VALUE = "wrong value"
SIGNED_ZERO = "wrong sign of zero"
DTYPE = "wrong dtype"
SHAPE = "wrong shape"
STRIDE = "wrong stride"
STRUCTURE = "wrong structure"
EXC_TYPE = "exception mismatch"
EXC_MSG = "exception message mismatch"
KILN_RAISED = "kiln raised where eager didn't"
EAGER_RAISED = "eager raised where kiln didn't"
INPUTS_AFTER_EXC = "inputs differ after exception"
HARNESS = "harness error"

CATEGORIES = (CRASH, VALUE, SIGNED_ZERO, DTYPE, SHAPE, STRIDE, STRUCTURE, EXC_TYPE, EXC_MSG,
              KILN_RAISED, EAGER_RAISED, INPUTS_AFTER_EXC, HARNESS)
# Short names for command-line filters (--ignore stride,message).
SHORT = {"crash": CRASH, "value": VALUE, "zero": SIGNED_ZERO, "dtype": DTYPE, "shape": SHAPE,
         "stride": STRIDE, "structure": STRUCTURE, "exception": EXC_TYPE, "message": EXC_MSG,
         "kiln-raised": KILN_RAISED, "eager-raised": EAGER_RAISED,
         "inputs-after-exception": INPUTS_AFTER_EXC, "harness": HARNESS}

F32, F64, I32, I64, BOOL = torch.float32, torch.float64, torch.int32, torch.int64, torch.bool
F16, BF16 = torch.float16, torch.bfloat16
# KILN_FUZZ_HALF=1 (bench/fuzz.py --half): inputs and casts in float16 and bfloat16 too. Off by
# default, so the seeds CI runs keep their programs.
HALF = os.environ.get("KILN_FUZZ_HALF", "0") == "1"
DTYPES = (F32, F64, I32, I64, BOOL) + ((F16, BF16) if HALF else ())
DTYPE_WEIGHTS = [5, 2, 2, 3, 2] + ([3, 3] if HALF else [])
DTYPE_SRC = {F32: "torch.float32", F64: "torch.float64", I32: "torch.int32", I64: "torch.int64",
             BOOL: "torch.bool", F16: "torch.float16", BF16: "torch.bfloat16"}
LAYOUTS = ("contiguous", "transposed", "sliced", "expanded", "offset")

MAX_NUMEL = 4096  # no intermediate larger than this (keeps kernels and eager quick)


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------

@dataclass
class InputSpec:
    shape: tuple
    dtype: torch.dtype
    layout: str = "contiguous"
    perm: tuple = ()          # transposed: storage order of the dims
    steps: tuple = ()         # sliced: step per dim (1 = not sliced)
    starts: tuple = ()        # sliced: first index per dim
    expanded: tuple = ()      # expanded: dims of stride 0
    offset: int = 0           # offset: elements of storage before the view
    edge: bool = False        # sprinkle edge values (0, -1, INT_MIN/MAX; -0.0, inf, nan)
    scale: float = 1.0        # floats: spread of the values
    integral: bool = False    # floats: integer values (ties in comparisons, exact floor/round)

    def describe(self) -> str:
        extra = {"transposed": f" perm={self.perm}", "sliced": f" steps={self.steps} starts={self.starts}",
                 "expanded": f" stride-0 dims={self.expanded}", "offset": f" storage_offset={self.offset}"}
        return (f"{tuple(self.shape)} {str(self.dtype).replace('torch.', '')} {self.layout}"
                f"{extra.get(self.layout, '')}{' edge-values' if self.edge else ''}"
                f"{' integral' if self.integral else ''}{'' if self.scale == 1.0 else f' scale={self.scale}'}")


def resized(shape: tuple) -> tuple:
    """The third input set's sizes: every size >= 2 grows by one (sizes 0 and 1 stay, so what
    broadcast still broadcasts, equal sizes stay equal and unequal ones unequal)."""
    return tuple(s + 1 if s >= 2 else s for s in shape)


def _values(n: int, spec: InputSpec, g: torch.Generator) -> torch.Tensor:
    dt = spec.dtype
    if dt == BOOL:
        return torch.rand(n, generator=g) > 0.5
    if dt.is_floating_point:
        if spec.integral:
            v = torch.randint(-4, 5, (n,), generator=g).to(dt)
        else:
            v = (torch.randn(n, generator=g, dtype=F64) * spec.scale).to(dt)
        if spec.edge and n:
            edges = torch.tensor([-0.0, 0.0, math.inf, -math.inf, math.nan, 1.0, -1.0, 0.5], dtype=dt)
            mask = torch.rand(n, generator=g) < 0.3
            pick = edges[torch.randint(0, len(edges), (n,), generator=g)]
            v = torch.where(mask, pick, v)
        return v
    info = torch.iinfo(dt)
    v = torch.randint(-9, 10, (n,), generator=g, dtype=dt)
    if spec.edge and n:
        edges = torch.tensor([0, -1, 1, info.min, info.max], dtype=dt)
        mask = torch.rand(n, generator=g) < 0.3
        pick = edges[torch.randint(0, len(edges), (n,), generator=g)]
        v = torch.where(mask, pick, v)
    return v


def make_input(spec: InputSpec, g: torch.Generator, shape: tuple | None = None) -> torch.Tensor:
    """A tensor of spec's dtype and layout (of `shape`, default spec.shape) on a fresh storage."""
    shape = tuple(spec.shape if shape is None else shape)
    nd = len(shape)
    lay = spec.layout
    if lay == "transposed" and nd >= 2:
        stored = tuple(shape[p] for p in spec.perm)
        base = _values(math.prod(stored), spec, g).view(stored)
        inv = [spec.perm.index(i) for i in range(nd)]
        return base.permute(inv)
    if lay == "sliced" and nd >= 1:
        big = tuple(st + (s - 1) * k + 1 + (k - 1) if s > 0 else st for s, k, st in
                    zip(shape, spec.steps, spec.starts))
        base = _values(math.prod(big), spec, g).view(big)
        idx = tuple(slice(st, st + (s - 1) * k + 1 if s > 0 else st, k)
                    for s, k, st in zip(shape, spec.steps, spec.starts))
        t = base[idx]
        assert t.shape == shape, (t.shape, shape)
        return t
    if lay == "expanded" and nd >= 1:
        small = tuple(1 if i in spec.expanded else s for i, s in enumerate(shape))
        base = _values(math.prod(small), spec, g).view(small)
        return base.expand(shape)
    if lay == "offset":
        n = math.prod(shape)
        base = _values(n + spec.offset + 2, spec, g)
        return base[spec.offset:spec.offset + n].view(shape)
    return _values(math.prod(shape), spec, g).view(shape)


def make_inputs(specs, seed: int, which: int) -> list:
    """Input set `which` (0: the first, 1: fresh values, 2: different sizes) of a program."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + which * 7919) % (1 << 62))
    return [make_input(s, g, resized(s.shape) if which == 2 else None) for s in specs]


def _gen_specs(rng: random.Random) -> list:
    n = rng.choice([1, 1, 2, 2, 2, 3, 3])
    sizes = rng.sample([2, 3, 4, 5], 2) + [rng.choice([2, 3, 4, 5, 6, 7])]
    shared = rng.random() < 0.65
    base_nd = rng.choices([0, 1, 2, 3, 4, 5], weights=[1, 3, 5, 4, 2, 1])[0]
    base = [rng.choice(sizes) for _ in range(base_nd)]
    specs = []
    for _ in range(n):
        if shared and rng.random() < 0.85:
            # aligned from the right with the shared base shape: drop leading dims, some become 1
            nd = rng.randint(max(0, base_nd - 2), base_nd)
            shape = list(base[base_nd - nd:])
            for i in range(nd):
                if rng.random() < 0.2:
                    shape[i] = 1
        else:
            nd = rng.choices([0, 1, 2, 3, 4, 5], weights=[1, 3, 5, 4, 2, 1])[0]
            shape = [rng.choice(sizes) for _ in range(nd)]
        for i in range(len(shape)):
            r = rng.random()
            if r < 0.04:
                shape[i] = 0
            elif r < 0.12:
                shape[i] = 1
        shape = tuple(shape)
        dtype = rng.choices(DTYPES, weights=DTYPE_WEIGHTS)[0]
        lay = rng.choices(LAYOUTS, weights=[5, 2, 2, 1.5, 1.5])[0]
        spec = InputSpec(shape, dtype, lay)
        nd = len(shape)
        if lay == "transposed":
            if nd < 2:
                spec.layout = "contiguous"
            else:
                perm = list(range(nd))
                while perm == sorted(perm):
                    rng.shuffle(perm)
                spec.perm = tuple(perm)
        elif lay == "sliced":
            if nd == 0:
                spec.layout = "offset"
                spec.offset = rng.randint(1, 5)
            else:
                steps = [rng.choice([1, 2, 3]) if rng.random() < 0.6 else 1 for _ in range(nd)]
                if all(k == 1 for k in steps):
                    steps[rng.randrange(nd)] = 2
                spec.steps = tuple(steps)
                spec.starts = tuple(rng.choice([0, 0, 1]) for _ in range(nd))
        elif lay == "expanded":
            if nd == 0:
                spec.layout = "contiguous"
            else:
                dims = [i for i in range(nd) if rng.random() < 0.5] or [rng.randrange(nd)]
                spec.expanded = tuple(dims)
        elif lay == "offset":
            spec.offset = rng.randint(1, 7)
        spec.edge = rng.random() < 0.25
        if dtype.is_floating_point:
            spec.integral = rng.random() < 0.2
            spec.scale = rng.choice([1.0, 1.0, 1.0, 3.0, 30.0])
        specs.append(spec)
    return specs


# ---------------------------------------------------------------------------------------------
# Programs
# ---------------------------------------------------------------------------------------------

@dataclass
class Program:
    seed: int
    source: str
    inputs: list
    invalid: bool = False  # its last statement was chosen because it raises

    def describe_inputs(self) -> str:
        names = "abc"
        return "\n".join(f"  {names[i]}: {s.describe()}" for i, s in enumerate(self.inputs))

    def reproducer(self) -> str:
        return f"# seed {self.seed}\n{self.source}\n# inputs:\n" + "\n".join(
            "#" + line[1:] for line in self.describe_inputs().splitlines())


def compile_source(source: str, name: str = "fn", filename: str = "<kiln-fuzz>"):
    glb = {"torch": torch, "F": torch.nn.functional, "__name__": "kiln_fuzz"}
    exec(compile(source, filename, "exec"), glb)
    return glb[name]


def _is_tensor(x) -> bool:
    return isinstance(x, torch.Tensor)


def _layout_copy(t: torch.Tensor) -> torch.Tensor:
    """t's size, stride, offset and values on a storage of its own (aliasing across tensors is
    not kept)."""
    n = t.untyped_storage().nbytes() // t.element_size()
    flat = t.new_empty(0).set_(t.untyped_storage(), 0, (n,), (1,)).clone()
    return flat.as_strided(t.size(), t.stride(), t.storage_offset())


@dataclass
class _Cand:
    lines: list
    new: list = field(default_factory=list)       # variables it defines
    reads: list = field(default_factory=list)     # variables it reads (consumed)


class _Gen:
    """The generator's state: a random stream, the program so far, and the eager values of its
    variables after running it on the first input set."""

    def __init__(self, seed: int):
        self.seed = seed
        self.rng = random.Random(seed)
        self.specs = _gen_specs(self.rng)
        self.args = "abc"[:len(self.specs)]
        self.lines: list = []
        self.pool: list = list(self.args)   # tensor variables
        self.tuples: list = []              # variables holding a (values, indices) result
        self.consumed: set = set()
        self.counter = 0
        self.sloppy = False
        self.ns = self._run_prefix()

    # -- eager evaluation of the program so far ------------------------------------------------
    def _run_prefix(self, extra: list | None = None) -> dict:
        ns = {"torch": torch, "F": torch.nn.functional}
        for name, t in zip(self.args, make_inputs(self.specs, self.seed, 0)):
            ns[name] = t
        src = "\n".join(self.lines + (extra or []))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exec(compile(src or "pass", "<gen>", "exec"), ns)
        return ns

    def try_cand(self, cand: _Cand) -> BaseException | None:
        """Runs cand after the program so far; None if it ran (and produced sane results)."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exec(compile("\n".join(cand.lines), "<gen>", "exec"), self.ns)
            for v in cand.new:
                x = self.ns[v]
                if _is_tensor(x) and x.numel() > MAX_NUMEL:
                    raise _TooBig()
                if isinstance(x, tuple) and any(_is_tensor(y) and y.numel() > MAX_NUMEL for y in x):
                    raise _TooBig()
            return None
        except BaseException as e:  # noqa: BLE001
            # restore the namespace (the candidate may have mutated tensors before raising)
            self.ns = self._run_prefix()
            return e

    def commit(self, cand: _Cand):
        self.lines.extend(cand.lines)
        for r in cand.reads:
            self.consumed.add(r)
        for v in cand.new:
            x = self.ns[v]
            if _is_tensor(x):
                self.pool.append(v)
            elif isinstance(x, tuple):
                self.tuples.append(v)

    # -- helpers ---------------------------------------------------------------------------
    def fresh(self) -> str:
        self.counter += 1
        return f"t{self.counter - 1}"

    def t(self, name: str) -> torch.Tensor:
        return self.ns[name]

    def pick(self, pred=None) -> str | None:
        names = [n for n in self.pool if pred is None or pred(self.t(n))]
        if not names:
            return None
        # prefer recent variables (chains of ops), but any can be picked
        w = [1.0 + i for i in range(len(names))]
        return self.rng.choices(names, weights=w)[0]

    def dim(self, nd: int) -> int:
        r = self.rng
        if self.sloppy and r.random() < 0.5:
            return r.choice([nd, -nd - 1, nd + 2])
        if nd == 0:
            return r.choice([0, -1])
        d = r.randrange(nd)
        return d if r.random() < 0.6 else d - nd

    def scalar(self, kind: str | None = None) -> str:
        r = self.rng
        kind = kind or r.choices(["int", "float", "bool", "size"], weights=[5, 5, 1, 1.5])[0]
        if kind == "int":
            return str(r.choice([0, 1, 1, 2, 2, 3, -1, -2, 5, 7, -7, 100]))
        if kind == "float":
            return r.choice(["0.5", "-1.5", "2.0", "0.0", "-0.0", "1e-3", "3.25", "-2.5", "1.0",
                             "float('inf')", "float('-inf')", "float('nan')", "1e30"]
                            if r.random() < 0.1 else ["0.5", "-1.5", "2.0", "0.0", "3.25", "-2.5", "1.0", "0.1"])
        if kind == "bool":
            return r.choice(["True", "False"])
        n = self.pick()
        if n is None:
            return "2"
        nd = self.t(n).dim()
        if nd == 0 and not self.sloppy:
            return f"{n}.numel()" if r.random() < 0.5 else f"{n}.dim()"
        i = self.dim(nd)
        return r.choice([f"{n}.shape[{i}]", f"{n}.size({i})", f"{n}.numel()", f"{n}.dim()",
                         f"len({n})", f"{n}.shape[{i}] * 2 - 1"])

    def operand(self, p_scalar: float = 0.25, pred=None) -> tuple:
        """(source, variable or None): a tensor variable or, sometimes, a Python scalar."""
        if self.rng.random() < p_scalar:
            return self.scalar(), None
        n = self.pick(pred)
        return (n, n) if n else (self.scalar(), None)

    def index_expr(self, shape: tuple) -> str:
        """A subscript valid for `shape` (unless sloppy): slices with steps, negative indices,
        integers, None and Ellipsis."""
        r = self.rng
        nd = len(shape)
        items = []
        k = r.randint(1, max(1, min(nd, 3))) if nd else 0
        used_ellipsis = False
        for d in range(k):
            s = shape[d]
            c = r.random()
            if c < 0.25 and (s > 0 or self.sloppy):
                i = r.randrange(max(s, 1))
                if self.sloppy and r.random() < 0.5:
                    i = s + r.randint(0, 2)
                items.append(str(i if r.random() < 0.5 else i - max(s, 1)))
            elif c < 0.75:
                start = r.choice(["", "", "1", "-2", "0"])
                stop = r.choice(["", "", "-1", "3", "2"])
                step = r.choice(["", "", "2", "3"])
                if self.sloppy and r.random() < 0.5:
                    step = r.choice(["0", "-1"])
                items.append(f"{start}:{stop}" + (f":{step}" if step else ""))
            elif c < 0.85:
                items.append("None")
            else:
                items.append(":")
        if r.random() < 0.3:
            if r.random() < 0.5 or not items:
                items.insert(0, "...")
                if nd and r.random() < 0.7:
                    s = shape[-1]
                    items[1:] = [str(r.choice([0, -1])) if s > 0 else "None"]
            else:
                items.append("...")
            used_ellipsis = True
        if not items or (r.random() < 0.15 and not used_ellipsis):
            items = ["None"] + items
        return ", ".join(items)


class _TooBig(Exception):
    pass


# -- statement builders: each returns a _Cand or None ------------------------------------------

UNARY = ["torch.neg({x})", "-{x}", "{x}.abs()", "torch.abs({x})", "~{x}", "torch.bitwise_not({x})",
         "torch.exp({x})", "torch.log({x})", "torch.sqrt({x})", "torch.rsqrt({x})", "torch.tanh({x})",
         "torch.sigmoid({x})", "torch.relu({x})", "F.relu({x})", "F.gelu({x})", "F.gelu({x}, approximate='tanh')",
         "torch.sin({x})", "torch.cos({x})", "{x}.exp()", "{x}.sqrt()", "torch.logical_not({x})",
         "{x}.sign()", "torch.floor({x})", "torch.ceil({x})", "torch.round({x})", "torch.trunc({x})",
         "torch.square({x})", "torch.reciprocal({x})", "torch.log1p({x})", "torch.expm1({x})",
         "torch.erf({x})", "torch.isnan({x})", "torch.isinf({x})", "torch.isfinite({x})", "F.silu({x})",
         "torch.log2({x})", "{x}.sigmoid()", "{x}.tanh()", "{x}.relu()", "torch.atan({x})",
         "torch.nan_to_num({x})", "{x}.log()", "torch.exp2({x})", "F.softplus({x})", "F.leaky_relu({x}, 0.1)",
         "{x}.bitwise_not()", "{x}.logical_not()", "{x}.neg()", "torch.positive({x})", "{x}.square()"]
BINOPS = ["+", "-", "*", "/", "//", "%", "**", "&", "|", "^", "+", "*", "-", "/", "//", "%"]
BINFUNCS = ["torch.add({a}, {b})", "torch.sub({a}, {b})", "torch.mul({a}, {b})", "torch.div({a}, {b})",
            "torch.div({a}, {b}, rounding_mode='floor')", "torch.div({a}, {b}, rounding_mode='trunc')",
            "torch.floor_divide({a}, {b})", "torch.remainder({a}, {b})", "torch.fmod({a}, {b})",
            "torch.pow({a}, {b})", "torch.bitwise_and({a}, {b})", "torch.bitwise_or({a}, {b})",
            "torch.bitwise_xor({a}, {b})", "torch.logical_and({a}, {b})", "torch.logical_or({a}, {b})",
            "torch.logical_xor({a}, {b})", "torch.maximum({a}, {b})", "torch.minimum({a}, {b})",
            "torch.add({a}, {b}, alpha=2)", "torch.sub({a}, {b}, alpha=3)", "torch.max({a}, {b})",
            "torch.min({a}, {b})", "torch.atan2({a}, {b})", "{a}.add({b})", "{a}.mul({b})", "{a}.sub({b})",
            "{a}.div({b})", "{a}.pow({b})", "torch.true_divide({a}, {b})"]
CMPOPS = ["<", "<=", ">", ">=", "==", "!="]
CMPFUNCS = ["torch.eq({a}, {b})", "torch.ne({a}, {b})", "torch.lt({a}, {b})", "torch.gt({a}, {b})",
            "torch.le({a}, {b})", "torch.ge({a}, {b})", "{a}.eq({b})", "{a}.lt({b})"]


def _b_unary(g: _Gen):
    x = g.pick()
    if x is None:
        return None
    v = g.fresh()
    return _Cand([f"{v} = " + g.rng.choice(UNARY).format(x=x)], [v], [x])


def _divisor_guard(g: _Gen, src: str, var: str | None, op: str) -> str:
    """For integer floor division/remainder, usually keep the divisor away from 0."""
    if var is not None and op in ("//", "%") and not g.sloppy:
        t = g.t(var)
        if not t.is_floating_point() and t.dtype != BOOL and g.rng.random() < 0.85:
            return f"({src} | 1)"
    return src


def _b_binary(g: _Gen):
    r = g.rng
    a, av = g.operand(0.15)
    b, bv = g.operand(0.35)
    if av is None and bv is None:
        return None
    if r.random() < 0.6:
        op = r.choice(BINOPS)
        if op in ("//", "%"):
            b = _divisor_guard(g, b, bv, op)
        if op == "**" and bv is None and av is not None and r.random() < 0.7:
            b = r.choice(["2", "3", "0.5", "2.0", "-1", "0", "-2.0", "1"])
        if av is None and r.random() < 0.5:
            a, b = b, a  # scalars first as often as last
        expr = f"{a} {op} {b}"
    else:
        if av is None:
            a, b, av, bv = b, a, bv, av
        expr = r.choice(BINFUNCS).format(a=a, b=b)
    v = g.fresh()
    return _Cand([f"{v} = {expr}"], [v], [x for x in (av, bv) if x])


def _b_compare(g: _Gen):
    r = g.rng
    a, av = g.operand(0.0)
    b, bv = g.operand(0.4)
    if r.random() < 0.7:
        expr = f"{a} {r.choice(CMPOPS)} {b}"
    else:
        expr = r.choice(CMPFUNCS).format(a=a, b=b)
    v = g.fresh()
    return _Cand([f"{v} = {expr}"], [v], [x for x in (av, bv) if x])


def _cond(g: _Gen) -> tuple:
    r = g.rng
    bools = [n for n in g.pool if g.t(n).dtype == BOOL]
    if bools and r.random() < 0.5 and not g.sloppy:
        n = r.choice(bools)
        return n, [n]
    x = g.pick()
    if g.sloppy and r.random() < 0.5:
        return x, [x]
    return f"{x} {r.choice(CMPOPS)} {g.scalar(r.choice(['int', 'float']))}", [x]


def _b_where(g: _Gen):
    c, reads = _cond(g)
    a, av = g.operand(0.3)
    b, bv = g.operand(0.3)
    v = g.fresh()
    form = g.rng.random()
    if form < 0.7:
        expr = f"torch.where({c}, {a}, {b})"
    elif av is not None:
        expr = f"{a}.where({c}, {b})"
    else:
        expr = f"torch.where({c}, {a}, {b})"
    return _Cand([f"{v} = {expr}"], [v], reads + [x for x in (av, bv) if x])


def _b_clamp(g: _Gen):
    r = g.rng
    x = g.pick()
    lo, lov = g.operand(0.6)
    hi, hiv = g.operand(0.6)
    form = r.randrange(8)
    expr = [f"{x}.clamp(min={lo})", f"{x}.clamp(max={hi})", f"{x}.clamp({lo}, {hi})",
            f"torch.clamp({x}, min={lo}, max={hi})", f"torch.clamp({x}, {lo})", f"{x}.clamp_min({lo})",
            f"{x}.clamp_max({hi})", f"torch.clip({x}, {lo}, {hi})"][form]
    if g.sloppy and r.random() < 0.2:
        expr = f"torch.clamp({x})"
    v = g.fresh()
    return _Cand([f"{v} = {expr}"], [v], [n for n in (x, lov, hiv) if n])


def _dims_arg(g: _Gen, nd: int, allow_tuple: bool = True) -> str | None:
    r = g.rng
    c = r.random()
    if c < 0.2:
        return None
    if c < 0.75 or not allow_tuple or nd < 2:
        return str(g.dim(nd))
    k = r.randint(2, min(nd, 3))
    dims = r.sample(range(nd), k)
    dims = [d - nd if r.random() < 0.4 else d for d in dims]
    if g.sloppy and r.random() < 0.5:
        dims.append(dims[0] - nd if dims[0] >= 0 else dims[0] + nd)
    return ("(" if r.random() < 0.7 else "[") + ", ".join(map(str, dims)) + (",)" if len(dims) == 1 else ")")


def _fix_brackets(s: str) -> str:
    return s[:-1] + "]" if s.startswith("[") and s.endswith(")") else s


def _b_reduction(g: _Gen):
    r = g.rng
    x = g.pick()
    nd = g.t(x).dim()
    op = r.choice(["sum", "sum", "mean", "amax", "amin", "prod", "any", "all", "max", "min",
                   "argmax", "argmin", "sum", "mean", "nansum", "std", "var", "logsumexp"])
    single = op in ("prod", "argmax", "argmin", "max", "min")
    d = _dims_arg(g, nd, allow_tuple=not single or g.sloppy)
    d = _fix_brackets(d) if d else d
    keep = r.random() < 0.4
    v = g.fresh()
    if op in ("max", "min") and d is not None:
        # (values, indices)
        kw = ", keepdim=True" if keep else ""
        call = r.choice([f"{x}.{op}({d}{kw})", f"torch.{op}({x}, {d}{kw})", f"{x}.{op}(dim={d}{kw})"])
        form = r.random()
        if form < 0.3:
            w = g.fresh()
            return _Cand([f"{v}, {w} = {call}"], [v, w], [x])
        if form < 0.5:
            return _Cand([f"{v} = {call}.{r.choice(['values', 'indices'])}"], [v], [x])
        if form < 0.65:
            return _Cand([f"{v} = {call}[{r.choice([0, 1, -1])}]"], [v], [x])
        return _Cand([f"{v} = {call}"], [v], [x])
    if op == "logsumexp" and d is None:
        d = str(g.dim(nd))
    if d is None:
        expr = r.choice([f"{x}.{op}()", f"torch.{op}({x})"])
        if op in ("sum", "mean") and r.random() < 0.15:
            expr = f"{x}.{op}(dtype={r.choice([DTYPE_SRC[F64], DTYPE_SRC[F32], DTYPE_SRC[I64]])})"
    else:
        kw = [f", keepdim={keep}", f", {keep}", ""][r.randrange(3)] if keep or r.random() < 0.3 else ""
        expr = r.choice([f"{x}.{op}({d}{kw})", f"torch.{op}({x}, {d}{kw})",
                         f"{x}.{op}(dim={d}{', keepdim=' + str(keep) if keep else ''})"])
    return _Cand([f"{v} = {expr}"], [v], [x])


def _b_tuple_use(g: _Gen):
    if not g.tuples:
        return None
    r = g.rng
    n = r.choice(g.tuples)
    v = g.fresh()
    return _Cand([f"{v} = {n}{r.choice(['.values', '.indices', '[0]', '[1]'])}"], [v], [n])


def _b_softmax(g: _Gen):
    r = g.rng
    x = g.pick()
    d = g.dim(g.t(x).dim())
    fn = r.choice(["torch.softmax", "torch.log_softmax", "F.softmax", "F.log_softmax"])
    if r.random() < 0.3:
        expr = f"{x}.{fn.split('.')[-1]}({d})"
    elif r.random() < 0.15:
        expr = f"{fn}({x}, {d}, dtype={r.choice([DTYPE_SRC[F64], DTYPE_SRC[F32]])})"
    else:
        expr = f"{fn}({x}, dim={d})"
    v = g.fresh()
    return _Cand([f"{v} = {expr}"], [v], [x])


def _b_view(g: _Gen):
    r = g.rng
    x = g.pick()
    s = tuple(g.t(x).shape)
    nd = len(s)
    forms = ["view(-1)", "reshape(-1)", "flatten()", "unsqueeze", "squeeze()", "squeeze(d)",
             "transpose", "permute", "t", "mT", "expand", "reshape2", "view_shape", "flatten2",
             "contiguous()", "merge", "view_tail", "expand_as", "unsqueeze_neg", "movedim"]
    f = r.choice(forms)
    if f in ("view(-1)", "reshape(-1)", "flatten()", "squeeze()", "contiguous()"):
        expr = f"{x}.{f}"
    elif f == "unsqueeze":
        expr = f"{x}.unsqueeze({r.randint(-nd - 1, nd)})"
    elif f == "unsqueeze_neg":
        expr = f"torch.unsqueeze({x}, -1)"
    elif f == "squeeze(d)":
        expr = f"{x}.squeeze({g.dim(nd)})"
    elif f == "transpose":
        expr = f"{x}.transpose({g.dim(nd)}, {g.dim(nd)})"
    elif f == "movedim":
        expr = f"torch.movedim({x}, {g.dim(nd)}, {g.dim(nd)})"
    elif f == "permute":
        p = list(range(nd))
        r.shuffle(p)
        p = [d - nd if r.random() < 0.3 else d for d in p]
        if g.sloppy and r.random() < 0.5:
            p = p[:-1] if p else [0]
        expr = f"{x}.permute({', '.join(map(str, p))})" if r.random() < 0.5 else f"{x}.permute({tuple(p)})"
    elif f == "t":
        expr = f"{x}.t()" if r.random() < 0.6 else f"torch.t({x})"
    elif f == "mT":
        expr = f"{x}.mT"
    elif f == "expand":
        new = r.choice([0, 1, 1, 2])
        sizes = [str(r.choice([2, 3, 4])) for _ in range(new)]
        sizes += [str(r.choice([2, 3])) if d == 1 and r.random() < 0.6 else "-1" for d in s]
        if g.sloppy and sizes:
            sizes[-1] = str(r.choice([5, 7]))
        expr = f"{x}.expand({', '.join(sizes)})" if sizes else f"{x}.expand(())"
    elif f == "expand_as":
        y = g.pick()
        expr = f"{x}.expand_as({y})"
    elif f == "reshape2":
        if nd == 0:
            return None
        i = g.dim(nd)
        expr = r.choice([f"{x}.reshape({x}.shape[{i}], -1)", f"{x}.view(-1, {x}.shape[{i}])",
                         f"{x}.reshape(-1, {x}.size({i}))"])
    elif f == "view_shape":
        k = r.randint(0, nd)
        expr = r.choice([f"{x}.view(*{x}.shape[:{k}], -1)", f"{x}.reshape({x}.shape[:{k}] + (-1,))",
                         f"{x}.view({x}.shape)", f"{x}.reshape(1, *{x}.shape)"])
    elif f == "flatten2":
        a = g.dim(nd)
        b = g.dim(nd)
        expr = f"{x}.flatten({a}, {b})" if r.random() < 0.6 else f"torch.flatten({x}, {a})"
    elif f == "merge":
        if nd < 2:
            return None
        i = r.randrange(nd - 1)
        parts = [f"{x}.shape[{j}]" for j in range(i)] + [f"{x}.shape[{i}] * {x}.shape[{i + 1}]"] + \
                [f"{x}.shape[{j}]" for j in range(i + 2, nd)]
        expr = f"{x}.{r.choice(['view', 'reshape'])}({', '.join(parts)})"
    else:  # view_tail: split a dim by a literal factor
        cands = [(i, k) for i, d in enumerate(s) for k in (2, 3) if d and d % k == 0]
        if not cands:
            return None
        i, k = r.choice(cands)
        parts = [f"{x}.shape[{j}]" for j in range(i)] + [str(k), "-1"] + [f"{x}.shape[{j}]" for j in range(i + 1, nd)]
        expr = f"{x}.view({', '.join(parts)})"
    v = g.fresh()
    return _Cand([f"{v} = {expr}"], [v], [x])


def _b_index(g: _Gen):
    r = g.rng
    x = g.pick()
    t = g.t(x)
    c = r.random()
    if c < 0.55:
        expr = f"{x}[{g.index_expr(tuple(t.shape))}]"
    elif c < 0.7:
        nd = t.dim()
        if nd == 0 and not g.sloppy:
            return None
        d = g.dim(nd)
        size = t.shape[d] if -nd <= d < nd else 1
        if size == 0 and not g.sloppy:
            return None
        i = r.randrange(max(size, 1))
        i = i - size if r.random() < 0.4 else i
        expr = f"{x}.select({d}, {i})" if r.random() < 0.6 else f"torch.select({x}, {d}, {i})"
    elif c < 0.8:
        nd = t.dim()
        if nd == 0 and not g.sloppy:
            return None
        d = g.dim(nd)
        size = t.shape[d] if -nd <= d < nd else 3
        st = r.randint(0, size)
        ln = r.randint(0, size - st)
        expr = f"{x}.narrow({d}, {st}, {ln})"
    elif c < 0.9:
        expr = f"{x}[None]" if r.random() < 0.5 else f"{x}[..., None]"
    else:
        expr = f"{x}[..., 0]" if r.random() < 0.5 else f"{x}[-1]"
    v = g.fresh()
    return _Cand([f"{v} = {expr}"], [v], [x])


def _mm_ok(op: str, sa: tuple, sb: tuple) -> bool:
    if op == "mm":
        return len(sa) == 2 and len(sb) == 2 and sa[1] == sb[0]
    if op == "bmm":
        return len(sa) == 3 and len(sb) == 3 and sa[0] == sb[0] and sa[2] == sb[1]
    if not sa or not sb:
        return False
    ka = sa[-1]
    kb = sb[0] if len(sb) == 1 else sb[-2]
    if ka != kb:
        return False
    if len(sa) > 2 and len(sb) > 2:
        try:
            torch.broadcast_shapes(sa[:-2], sb[:-2])
        except RuntimeError:
            return False
    return True


def _b_matmul(g: _Gen):
    r = g.rng
    names = [n for n in g.pool if g.t(n).dim() >= 1 and g.t(n).dtype != BOOL] if not g.sloppy else list(g.pool)
    if not names:
        return None
    op = r.choice(["@", "@", "matmul", "mm", "bmm", "method"])
    derived = []
    for n in names:
        t = g.t(n)
        derived.append((n, tuple(t.shape), t.dtype, n))
        if t.dim() >= 2:
            sh = tuple(t.shape)
            derived.append((f"{n}.mT", sh[:-2] + (sh[-1], sh[-2]), t.dtype, n))
            derived.append((f"{n}.transpose(-1, -2)", sh[:-2] + (sh[-1], sh[-2]), t.dtype, n))
            derived.append((f"{n}[..., 0]", sh[:-1], t.dtype, n))
            if t.dim() == 2:
                derived.append((f"{n}[0]", sh[1:], t.dtype, n) if sh[0] > 0 else (f"{n}.t()", sh[::-1], t.dtype, n))
        if t.dim() == 1 and t.shape[0] > 0:
            derived.append((f"{n}[:, None]", tuple(t.shape) + (1,), t.dtype, n))
            derived.append((f"{n}[None]", (1,) + tuple(t.shape), t.dtype, n))
    pairs = []
    key = {"@": "mat", "matmul": "mat", "method": "mat", "mm": "mm", "bmm": "bmm"}[op]
    for a in derived:
        for b in derived:
            if g.sloppy or (a[2] == b[2] and _mm_ok(key, a[1], b[1])):
                pairs.append((a, b))
    if not pairs:
        # something always valid: x @ x.mT
        a = r.choice(names)
        t = g.t(a)
        if t.dim() == 1:
            pairs = [((a, 0, 0, a), (a, 0, 0, a))]
        else:
            pairs = [((a, 0, 0, a), (f"{a}.mT", 0, 0, a))]
        op = "@"
    (sa, _, _, va), (sb, _, _, vb) = r.choice(pairs)
    expr = {"@": f"{sa} @ {sb}", "matmul": f"torch.matmul({sa}, {sb})", "mm": f"torch.mm({sa}, {sb})",
            "bmm": f"torch.bmm({sa}, {sb})", "method": f"{sa}.matmul({sb})"}[op]
    v = g.fresh()
    return _Cand([f"{v} = {expr}"], [v], [va, vb])


def _b_cat(g: _Gen):
    r = g.rng
    x = g.pick()
    t = g.t(x)
    nd = t.dim()
    stack = r.random() < 0.35
    d = g.dim(nd + 1 if stack else nd)
    others = [n for n in g.pool if n != x and g.t(n).dim() == nd]
    if stack:
        same = [n for n in others if g.t(n).shape == t.shape] if not g.sloppy else others
        y = r.choice(same) if same and r.random() < 0.6 else r.choice([f"{x} * 2", x, f"-{x}", f"{x}.abs()"])
    else:
        dd = d % nd if nd else 0
        ok = [n for n in others if all(i == dd or g.t(n).shape[i] == t.shape[i] for i in range(nd))] \
            if not g.sloppy else others
        y = r.choice(ok) if ok and r.random() < 0.6 else r.choice([x, f"{x} + 1", f"{x}[:1]" if nd else x])
    items = [x, y] + ([x] if r.random() < 0.2 else [])
    seq = "[" + ", ".join(items) + "]" if r.random() < 0.6 else "(" + ", ".join(items) + ")"
    fn = "torch.stack" if stack else r.choice(["torch.cat", "torch.cat", "torch.concat"])
    expr = f"{fn}({seq}, {'dim=' if r.random() < 0.5 else ''}{d})" if r.random() < 0.85 else f"{fn}({seq})"
    v = g.fresh()
    return _Cand([f"{v} = {expr}"], [v], [n for n in items if n in g.pool])


def _b_cast(g: _Gen):
    r = g.rng
    x = g.pick()
    dt = r.choice(DTYPES)
    form = r.random()
    if form < 0.3:
        expr = f"{x}.to({DTYPE_SRC[dt]})"
    elif form < 0.4:
        expr = f"{x}.to(dtype={DTYPE_SRC[dt]})"
    elif form < 0.5:
        y = g.pick()
        expr = r.choice([f"{x}.to({y}.dtype)", f"{x}.type_as({y})"])
    else:
        expr = f"{x}.{r.choice(['float', 'long', 'int', 'bool', 'double'])}()"
    v = g.fresh()
    return _Cand([f"{v} = {expr}"], [v], [x])


INPLACE = ["{x}.add_({b})", "{x}.sub_({b})", "{x}.mul_({b})", "{x}.div_({b})", "{x} += {b}", "{x} *= {b}",
           "{x} -= {b}", "{x}.clamp_(min={s})", "{x}.clamp_({s}, {s2})", "{x}.relu_()", "{x}.neg_()",
           "{x}.abs_()", "{x}.copy_({b})", "{x}.fill_({s})", "{x}.zero_()", "{x}.exp_()", "{x} /= {b}",
           "{x}.masked_fill_({x} > 0, {s})", "{x} //= {b}", "{x} &= {b}", "{x}.pow_(2)", "{x}.sigmoid_()",
           "torch.relu_({x})", "{x}.floor_()"]


def _b_inplace(g: _Gen):
    r = g.rng
    x = g.pick()
    b, bv = g.operand(0.4)
    tmpl = r.choice(INPLACE)
    if "//=" in tmpl:
        b = _divisor_guard(g, b, bv, "//")
    lines = [tmpl.format(x=x, b=b, s=g.scalar(r.choice(["int", "float"])), s2=g.scalar(r.choice(["int", "float"])))]
    reads = [bv] if bv and bv != x and "{b}" in tmpl else []
    return _Cand(lines, [], reads)


def _b_setitem(g: _Gen):
    r = g.rng
    x = g.pick()
    t = g.t(x)
    idx = g.index_expr(tuple(t.shape))
    if r.random() < 0.6:
        val, vv = g.scalar(r.choice(["int", "float", "bool"])), None
    else:
        val, vv = g.operand(0.0)
    return _Cand([f"{x}[{idx}] = {val}"], [], [vv] if vv and vv != x else [])


def _b_view_then_inplace(g: _Gen):
    """A view of a variable mutated in place: the base (maybe an input) sees it."""
    r = g.rng
    x = g.pick()
    t = g.t(x)
    v = g.fresh()
    view = r.choice([f"{x}[{g.index_expr(tuple(t.shape))}]", f"{x}.view(-1)", f"{x}.transpose(0, -1)",
                     f"{x}.unsqueeze(0)", f"{x}.t()" if t.dim() <= 2 else f"{x}.mT" if t.dim() >= 2 else f"{x}[None]"])
    op = r.choice(["add_(1)", "mul_(2)", "zero_()", "fill_(3)", "neg_()", "clamp_(max=0)", "sub_(" + x + ".sum())"])
    return _Cand([f"{v} = {view}", f"{v}.{op}"], [v], [x])


BUILDERS = [(_b_unary, 10), (_b_binary, 18), (_b_compare, 5), (_b_where, 4), (_b_clamp, 4),
            (_b_reduction, 12), (_b_tuple_use, 2), (_b_softmax, 4), (_b_view, 10), (_b_index, 7),
            (_b_matmul, 6), (_b_cat, 4), (_b_cast, 6), (_b_inplace, 3), (_b_setitem, 1.5),
            (_b_view_then_inplace, 1.5)]
_FUNCS = [b for b, _ in BUILDERS]
_WEIGHTS = [w for _, w in BUILDERS]


def generate(seed: int) -> Program:
    """The program of `seed` (deterministic)."""
    g = _Gen(seed)
    r = g.rng
    n_stmts = r.randint(1, 8)
    want_invalid = r.random() < 0.1
    for _ in range(n_stmts - (1 if want_invalid else 0)):
        for _attempt in range(30):
            b = r.choices(_FUNCS, weights=_WEIGHTS)[0]
            counter = g.counter
            cand = b(g)
            if cand is None:
                g.counter = counter
                continue
            err = g.try_cand(cand)
            if err is None:
                g.commit(cand)
                break
            g.counter = counter
    invalid = False
    invalid_var = None
    if want_invalid:
        g.sloppy = True
        for _attempt in range(60):
            b = r.choices(_FUNCS, weights=_WEIGHTS)[0]
            cand = b(g)
            if cand is None:
                continue
            err = g.try_cand(cand)
            if err is not None and isinstance(err, (RuntimeError, IndexError, TypeError, ValueError)) \
                    and not isinstance(err, _TooBig):
                g.lines.extend(cand.lines)
                invalid = True
                invalid_var = cand.new[0] if cand.new else None
                break
        g.sloppy = False
    # return what no later statement read (a tuple of them), sometimes only the last one
    produced = [v for v in g.pool[len(g.args):] + g.tuples]
    order = {v: i for i, v in enumerate(_defined_order(g.lines))}
    produced.sort(key=lambda v: order.get(v, 0))
    unused = [v for v in produced if v not in g.consumed]
    if invalid_var:
        unused.append(invalid_var)
    if not unused:
        unused = [produced[-1]] if produced else [g.args[0]]
    if r.random() < 0.08 and len(unused) > 1 and not invalid:
        unused = unused[-1:]  # leaves dead code
    if len(unused) == 1:
        ret = unused[0]
    elif r.random() < 0.15:
        ret = "[" + ", ".join(unused) + "]"
    else:
        ret = ", ".join(unused)
    body = g.lines or ["pass"]
    src = f"def fn({', '.join(g.args)}):\n" + "".join(f"    {line}\n" for line in body) + f"    return {ret}\n"
    return Program(seed, src, g.specs, invalid)


def _defined_order(lines):
    out = []
    for line in lines:
        m = re.match(r"^\s*([\w, ]+?)\s*=(?!=)", line)
        if m and "[" not in m.group(1):
            out.extend(s.strip() for s in m.group(1).split(","))
    return out


# ---------------------------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------------------------

TOL = {F64: (1e-5, 1e-6), F32: (1e-4, 1e-5), torch.float16: (1e-2, 1e-3), torch.bfloat16: (5e-2, 1e-2)}


@dataclass
class Failure:
    category: str
    detail: str
    which: int = 0  # input set: 0 first, 1 fresh values, 2 different sizes

    def to_json(self):
        return dataclasses.asdict(self)


def is_dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: the elements fill a block of storage exactly once."""
    dims = [(st, sz) for st, sz in zip(t.stride(), t.shape) if sz != 1]
    dims.sort()
    expect = 1
    for st, sz in dims:
        if st != expect:
            return False
        expect *= sz
    return True


def _fmt(t: torch.Tensor, limit: int = 12) -> str:
    flat = t.detach().reshape(-1)
    vals = flat[:limit].tolist()
    return f"{vals}{' ...' if flat.numel() > limit else ''}"


def _compare_tensor(act, exp, path, out, check_strides, cond=None, tally=None):
    if exp.dtype != act.dtype:
        out.append(Failure(DTYPE, f"{path}: dtype {act.dtype} != eager {exp.dtype}"))
        return
    if exp.shape != act.shape:
        out.append(Failure(SHAPE, f"{path}: shape {tuple(act.shape)} != eager {tuple(exp.shape)}"))
        return
    if exp.device != act.device:
        out.append(Failure(STRUCTURE, f"{path}: device {act.device} != eager {exp.device}"))
        return
    e = exp.detach()
    a = act.detach()
    # the conditioning rule: elements whose value (or only sign of zero) is not compared
    skip_v = skip_z = None
    if cond is not None:
        skip_v, skip_z = cond.skips(exp)
        skip_z = skip_z & ~skip_v
        if tally is not None:
            tally["values"] += int(skip_v.sum())
            tally["zero_signs"] += int(skip_z.sum()) if e.is_floating_point() else 0
    note = f" ({int(skip_v.sum())} ill-conditioned values not compared)" if skip_v is not None and skip_v.any() else ""
    if e.is_floating_point():
        rtol, atol = TOL.get(e.dtype, (1e-5, 1e-6)) if BACKEND == "inductor" else (0.0, 0.0)
        e64, a64 = e.double(), a.double()
        bad = ~torch.isclose(a64, e64, rtol=rtol, atol=atol, equal_nan=True)
        # isclose treats inf == inf (same sign) and inf != -inf; finite vs inf is not close
        zbad = (e64 == 0) & (a64 == 0) & (torch.signbit(a64) != torch.signbit(e64))
        if skip_v is not None:
            if tally is not None:
                tally["differed"] += int(((bad | zbad) & skip_v).sum()) + int((zbad & skip_z).sum())
            bad &= ~skip_v
            zbad &= ~(skip_v | skip_z)
        if bad.any():
            idx = bad.nonzero()[0].tolist()
            out.append(Failure(VALUE, f"{path}: {int(bad.sum())}/{e.numel()} values differ{note}; first at {idx}: "
                                      f"kiln {a[tuple(idx)].item()!r} vs eager {e[tuple(idx)].item()!r}\n"
                                      f"      kiln:  {_fmt(a)}\n      eager: {_fmt(e)}"))
            return
        if zbad.any():
            idx = zbad.nonzero()[0].tolist()
            out.append(Failure(SIGNED_ZERO, f"{path}: {int(zbad.sum())}/{e.numel()} zeros differ in sign; first at "
                                            f"{idx}: kiln {a[tuple(idx)].item()!r} vs eager {e[tuple(idx)].item()!r}\n"
                                            f"      kiln:  {_fmt(a)}\n      eager: {_fmt(e)}"))
            return
    else:
        bad = a != e
        if skip_v is not None:
            if tally is not None:
                tally["differed"] += int((bad & skip_v).sum())
            bad &= ~skip_v
        if bad.any():
            idx = bad.nonzero()[0].tolist()
            out.append(Failure(VALUE, f"{path}: {int(bad.sum())}/{e.numel()} values differ{note}; first at {idx}: "
                                      f"kiln {a[tuple(idx)].item()!r} vs eager {e[tuple(idx)].item()!r}\n"
                                      f"      kiln:  {_fmt(a)}\n      eager: {_fmt(e)}"))
            return
    if check_strides and e.numel() > 0 and is_dense(e) and is_dense(a):
        es = [st for st, sz in zip(e.stride(), e.shape) if sz != 1]
        as_ = [st for st, sz in zip(a.stride(), a.shape) if sz != 1]
        if es != as_:
            out.append(Failure(STRIDE, f"{path}: stride {a.stride()} != eager {e.stride()} (shape {tuple(e.shape)})"))


def compare(act, exp, path: str, out: list, check_strides: bool = True, cond=None, tally=None):
    """Appends a Failure to `out` for each difference between kiln's `act` and eager's `exp`.
    cond: the Conditioning that watched eager compute `exp`; the values (and signs of zero) it
    marks ill-conditioned are not compared, and counted in `tally` (a dict: values, zero_signs,
    differed)."""
    if _is_tensor(exp):
        if not _is_tensor(act):
            out.append(Failure(STRUCTURE, f"{path}: kiln returned {type(act).__name__}, eager a Tensor"))
            return
        _compare_tensor(act, exp, path, out, check_strides, cond, tally)
    elif isinstance(exp, (tuple, list)):
        if type(act) is not type(exp):
            out.append(Failure(STRUCTURE, f"{path}: kiln returned {type(act).__module__}.{type(act).__name__}, "
                                          f"eager {type(exp).__module__}.{type(exp).__name__}"))
            return
        if len(act) != len(exp):
            out.append(Failure(STRUCTURE, f"{path}: {len(act)} items != eager {len(exp)}"))
            return
        for i, (x, y) in enumerate(zip(act, exp)):
            compare(x, y, f"{path}[{i}]", out, check_strides, cond, tally)
    elif isinstance(exp, float):
        if type(act) is not float:
            out.append(Failure(STRUCTURE, f"{path}: kiln returned {type(act).__name__}, eager float"))
        elif not (math.isclose(act, exp, rel_tol=1e-6, abs_tol=1e-9) or (math.isnan(act) and math.isnan(exp))):
            out.append(Failure(VALUE, f"{path}: kiln {act!r} != eager {exp!r}"))
    else:
        if type(act) is not type(exp):
            out.append(Failure(STRUCTURE, f"{path}: kiln returned {type(act).__name__}, eager {type(exp).__name__}"))
        elif act != exp:
            out.append(Failure(VALUE, f"{path}: kiln {act!r} != eager {exp!r}"))


def _norm_msg(e: BaseException) -> str:
    return " ".join(str(e).split())


def _exc_str(e: BaseException) -> str:
    m = _norm_msg(e)
    return f"{type(e).__name__}: {m[:300]}{'...' if len(m) > 300 else ''}"


# ---------------------------------------------------------------------------------------------
# Conditioning: which of eager's values a legitimate last-bit difference can move past TOL
# ---------------------------------------------------------------------------------------------
#
# kiln's kernels may round a transcendental function, a reduction or a matmul differently from
# torch's in the last bits; that is why floats are compared within TOL. A program can amplify
# such a difference past TOL: a remainder whose dividend sits at a multiple of its divisor (or
# cancels to a small result), a comparison of two nearly equal values, a floor at an integer, a
# cast to an integer, a divisor next to zero. And which of +0.0 and -0.0 a max/min reduction
# (or torch.maximum/minimum, clamp with tensor bounds) keeps in a tie is unspecified: torch's
# own vectorized and scalar loops disagree. `Conditioning` watches the eager run op by op and
# marks, element by element, what such a difference can change; `compare` leaves exactly those
# elements' values (or signs of zero) uncompared and counts them. See the Conditioning class.

COND_K = 4.0  # a jump within this many tolerance bands of an inexact value makes a result ill-conditioned

_MANTISSA = {F32: 24, F64: 53, torch.float16: 11, torch.bfloat16: 8}

_MUT_DUNDER = {"__setitem__": "setitem_", "__iadd__": "add_", "__isub__": "sub_", "__imul__": "mul_",
               "__itruediv__": "div_", "__idiv__": "div_", "__ifloordiv__": "floor_divide_",
               "__imod__": "remainder_", "__ipow__": "pow_", "__iand__": "bitwise_and_",
               "__ior__": "bitwise_or_", "__ixor__": "bitwise_xor_"}
_DUNDER = {"__add__": "add", "__radd__": "add", "__sub__": "sub", "__mul__": "mul", "__rmul__": "mul",
           "__truediv__": "div", "__div__": "div", "__floordiv__": "floor_divide", "__mod__": "remainder",
           "__pow__": "pow", "__matmul__": "matmul", "__and__": "bitwise_and", "__rand__": "bitwise_and",
           "__or__": "bitwise_or", "__ror__": "bitwise_or", "__xor__": "bitwise_xor", "__rxor__": "bitwise_xor",
           "__invert__": "bitwise_not", "__neg__": "neg", "__abs__": "abs", "__pos__": "positive",
           "__eq__": "eq", "__ne__": "ne", "__lt__": "lt", "__le__": "le", "__gt__": "gt", "__ge__": "ge",
           "__getitem__": "getitem", **_MUT_DUNDER}
# reflected operators: canonical name, operands swapped
_REFLECTED = {"__rsub__": "sub", "__rdiv__": "div", "__rtruediv__": "div", "__rpow__": "pow",
              "__rmod__": "remainder", "__rfloordiv__": "floor_divide", "__rmatmul__": "matmul"}
_ALIAS = {"true_divide": "div", "divide": "div", "clip": "clamp", "concat": "cat", "concatenate": "cat",
          "absolute": "abs", "negative": "neg", "multiply": "mul", "subtract": "sub", "fix": "trunc",
          "swapaxes": "transpose", "swapdims": "transpose", "moveaxis": "movedim", "greater": "gt",
          "greater_equal": "ge", "less": "lt", "less_equal": "le", "not_equal": "ne"}

# Ops that only move elements (a view, or a copy of them): an element keeps its marks.
_STRUCT = {"getitem", "contiguous", "expand", "expand_as", "flatten", "narrow", "permute", "reshape",
           "select", "squeeze", "unsqueeze", "t", "transpose", "view", "movedim", "cat", "stack", "clone",
           "positive", "mT", "T", "mH", "H", "detach", "view_as", "reshape_as", "unflatten", "ravel"}
_CASTS = {"to", "type_as", "bool", "int", "long", "float", "double", "half", "bfloat16", "short", "char",
          "byte"}
# Pointwise ops whose floating results kiln computes bit for bit as torch does (given the same
# operands): IEEE arithmetic, selection, comparisons, casts, rounding to integers.
_EXACT = {"add", "sub", "mul", "div", "neg", "abs", "square", "relu", "leaky_relu", "clamp", "clamp_min",
          "clamp_max", "maximum", "minimum", "nan_to_num", "bitwise_and", "bitwise_or", "bitwise_xor",
          "bitwise_not", "logical_and", "logical_or", "logical_xor", "logical_not", "sign", "floor", "ceil",
          "round", "trunc", "remainder", "fmod", "floor_divide", "lt", "le", "gt", "ge", "eq", "ne", "isnan",
          "isinf", "isfinite", "reciprocal"} | _CASTS
# Pointwise ops that may round differently (libm against torch's vectorized kernels).
_INEXACT = {"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "tanh", "sigmoid",
            "sin", "cos", "tan", "atan", "asin", "acos", "sinh", "cosh", "asinh", "acosh", "atanh", "erf",
            "erfc", "gelu", "silu", "softplus", "mish", "atan2", "pow"}
# Pointwise ops that select or overwrite elements: the marks go with the selected values.
_SELECT = {"where", "masked_fill", "setitem", "copy", "fill", "zero"}
# Floating results that are piecewise constant (any move is a jump).
_DISCRETE = {"floor", "ceil", "round", "trunc", "floor_divide", "sign"}
_REDUCE = {"sum", "nansum", "mean", "prod", "amax", "amin", "max", "min", "argmax", "argmin", "any", "all",
           "std", "var", "logsumexp", "softmax", "log_softmax"}
_MATMUL = {"matmul", "mm", "bmm", "dot", "mv"}
# New tensors from Python values or shapes: exact.
_FACTORIES = {"tensor", "as_tensor", "scalar_tensor", "zeros", "ones", "full", "empty", "arange",
              "linspace", "eye", "zeros_like", "ones_like", "full_like", "empty_like", "new_zeros",
              "new_ones", "new_full", "new_empty", "new_tensor"}


class _CondError(Exception):
    pass


def _op_name(func) -> str:
    n = getattr(func, "__name__", "") or ""
    if n == "__get__":  # a property (t.mT, t.shape): the descriptor's name
        n = getattr(getattr(func, "__self__", None), "__name__", n) or n
    return n


def _is_method(func) -> bool:
    q = getattr(func, "__qualname__", "") or ""
    return q.startswith("TensorBase.") or q.startswith("Tensor.")


def _tensors_in(obj, acc=None) -> list:
    """The tensors in obj (nested tuples, lists, dicts), each once, in order."""
    acc = [] if acc is None else acc
    if isinstance(obj, torch.Tensor):
        if not any(obj is t for t in acc):
            acc.append(obj)
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            _tensors_in(x, acc)
    elif isinstance(obj, dict):
        for x in obj.values():
            _tensors_in(x, acc)
    return acc


def _subst(obj, fn):
    """obj with every tensor t replaced by fn(t) (tuples, lists and dicts rebuilt)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_subst(x, fn) for x in obj)
    if isinstance(obj, list):
        return [_subst(x, fn) for x in obj]
    if isinstance(obj, dict):
        return {k: _subst(v, fn) for k, v in obj.items()}
    return obj


def _exact_sum(x: torch.Tensor, dtype, slice_sum) -> bool:
    """Whether every order of summing each slice of x in `dtype` gives one result: its finite
    values are multiples of 2**-8 and the magnitudes in a slice add up to less than 2**mantissa
    of them, so every partial sum is exact (infinities and NaNs give one result in any order).
    slice_sum(t): t's slices summed as the reduction does."""
    if dtype not in _MANTISSA:
        return False
    d = x.detach().double()
    fin = d.isfinite()
    s = torch.where(fin, d, 0.0) * 256.0
    if not bool((s == s.round()).all()):
        return False
    m = slice_sum(s.abs())
    return float(m.max()) < 2.0 ** _MANTISSA[dtype] if m.numel() else True


def _exact_prod(x: torch.Tensor, dtype, slice_prod) -> bool:
    """Whether every order of multiplying each slice of x gives one result: finite values are
    integers whose nonzero magnitudes in a slice multiply to less than 2**mantissa.
    slice_prod(t): t's slices multiplied as the reduction does."""
    if dtype not in _MANTISSA:
        return False
    d = x.detach().double()
    fin = d.isfinite()
    if not bool((torch.where(fin, d, 0.0) == torch.where(fin, d, 0.0).round()).all()):
        return False
    m = slice_prod(torch.where(fin & (d != 0), d.abs(), 1.0))
    return float(m.max()) < 2.0 ** (_MANTISSA[dtype] - 1) if m.numel() else True


def _element_key(t: torch.Tensor, shape):
    """Identifies the elements t contributes to a result of `shape` (two operands with one key
    are the same numbers and move together)."""
    try:
        b = torch.broadcast_to(t, shape)
    except RuntimeError:
        return ("object", id(t))
    return (t.untyped_storage().data_ptr() if t.numel() else id(t), t.dtype, b.storage_offset(), b.stride())


def _signed_zero(sign: float, dtype) -> torch.Tensor:
    return torch.tensor(math.copysign(0.0, sign), dtype=dtype)


def _diff(r: torch.Tensor, o: torch.Tensor):
    """(value differs, only the sign of a zero differs) between a re-run result r and o."""
    if r.shape != o.shape:
        raise _CondError(f"re-run gave shape {tuple(r.shape)}, not {tuple(o.shape)}")
    if o.is_floating_point() or o.is_complex():
        rd, od = r.double(), o.double()
        same = (rd == od) | (rd.isnan() & od.isnan())
        return ~same, same & (od == 0) & (rd.signbit() != od.signbit())
    return r != o, torch.zeros(o.shape, dtype=torch.bool)


class Conditioning(torch.overrides.TorchFunctionMode):
    """The conditioning rule: around an eager run of a program, marks which elements of which
    tensors a legitimate last-bit difference between kiln's kernels and torch's can change past
    the fuzzer's tolerance. Three boolean marks per element, kept per storage (so views, inputs
    mutated through views and in-place ops see them):

    * inexact: kiln may round it differently within TOL. Results of transcendental functions
      (_INEXACT; exact at +-0, +-inf, NaN, and pow with exponent 0/1/2 or base 1), of reductions
      over more than one element (sum, mean, prod, std, var, logsumexp, softmax, log_softmax;
      sums and products of small integers are exact in any order) and matmuls with an inner
      size over 1; and whatever an op computes from inexact operands where moving those
      operands by their bands moves the result. Inputs, views, copies, selections, comparisons
      and casts of exact values are exact.
    * ill-conditioned: moving the inexact operands of an op by COND_K tolerance bands (rtol*|x| +
      atol, TOL of their dtype) crosses a jump of the op (remainder, fmod, floor_divide, floor,
      ceil, round, trunc, sign, casts to integer or bool dtypes, comparisons, eq/ne, logical ops,
      any/all, argmax/argmin and max/min indices, a divisor or log/sqrt argument at zero, atan2's
      branch cut), or a remainder/fmod cancels so that one band of its operands exceeds the
      result's tolerance; and everything computed from ill-conditioned elements (where() and
      in-place writes only pass on the marks of what they select). kiln's value there is not
      compared with eager's.
    * zero sign unspecified: a zero that is the max/min of a tie between +0.0 and -0.0 (amax,
      amin, max, min, maximum, minimum, clamp with tensor bounds: torch's vectorized and scalar
      loops keep different operands), or that moving inexact operands makes a zero of the other
      sign. Only its sign is not compared; an op that turns that sign into a value (1/x, atan2,
      ...) makes its result ill-conditioned (every op is re-run with those zeros of either sign).

    The mode passes every call through unchanged (eager's results and exceptions are its own);
    the analysis runs after each call on torch ops of its own, which the mode does not see. An
    op it does not know, or an analysis that fails, is recorded in `problems` (the fuzzer
    reports those as harness errors rather than guessing)."""

    def __init__(self, k: float = COND_K):
        super().__init__()
        self.k = k
        self._shadows: dict = {}   # storage data_ptr -> [storage, element size, inexact, ill, zero sign]
        self.problems: list = []
        self.sources: list = []    # (op, what) where ill-conditioning or an unspecified zero sign starts

    # -- marks, kept per storage --------------------------------------------------------------
    def marks(self, t: torch.Tensor):
        """(inexact, ill-conditioned, zero sign unspecified): bool tensors of t's shape and strides."""
        if t.numel() == 0:
            z = torch.zeros(t.shape, dtype=torch.bool)
            return z, z, z
        sh = self._shadows.get(t.untyped_storage().data_ptr())
        if sh is None:
            n = t.untyped_storage().nbytes() // t.element_size()
            z = torch.zeros(n, dtype=torch.bool).as_strided(t.shape, t.stride(), t.storage_offset())
            return z, z, z
        if sh[1] != t.element_size():
            raise _CondError("a storage viewed with another element size")
        return tuple(f.as_strided(t.shape, t.stride(), t.storage_offset()) for f in sh[2:])

    def skips(self, t: torch.Tensor):
        """(values not to compare, signs of zero not to compare) for eager's tensor t."""
        _, ill, zs = self.marks(t)
        return ill, zs

    def _write(self, t: torch.Tensor, inex, ill, zs):
        if t.numel() == 0:
            return
        if not t.is_floating_point():
            inex = zs = False
        inex, ill, zs = (torch.broadcast_to(torch.as_tensor(m, dtype=torch.bool), t.shape) for m in (inex, ill, zs))
        st = t.untyped_storage()
        sh = self._shadows.get(st.data_ptr())
        if sh is None:
            if not (bool(inex.any()) or bool(ill.any()) or bool(zs.any())):
                return
            n = st.nbytes() // t.element_size()
            sh = [st, t.element_size()] + [torch.zeros(n, dtype=torch.bool) for _ in range(3)]
            self._shadows[st.data_ptr()] = sh
        for f, m in zip(sh[2:], (inex, ill, zs)):
            f.as_strided(t.shape, t.stride(), t.storage_offset()).copy_(m)

    def _kb(self, v, inex, k=None) -> torch.Tensor:
        """k (default COND_K) tolerance bands of each finite inexact element of v, float64; 0 elsewhere."""
        if not isinstance(v, torch.Tensor):
            return torch.zeros((), dtype=F64)
        if not v.is_floating_point():
            return torch.zeros(v.shape, dtype=F64)
        rtol, atol = TOL.get(v.dtype, (1e-5, 1e-6))
        d = v.detach().double()
        b = (self.k if k is None else k) * (rtol * d.abs() + atol)
        return torch.where(inex & d.isfinite(), b, 0.0)

    # -- the mode ----------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        raw = _op_name(func)
        mutating = raw in _MUT_DUNDER or (raw.endswith("_") and not raw.startswith("_"))
        tensors = _tensors_in((args, kwargs))
        pre = {id(t): t.detach().clone() for t in tensors} if mutating else None
        versions = [t._version for t in tensors]
        out = func(*args, **kwargs)  # eager's own call: its result and exceptions pass through untouched
        try:
            with torch.no_grad():
                self._after(func, raw, mutating, args, kwargs, out, tensors, versions, pre)
        except Exception as e:  # noqa: BLE001
            self.problems.append(f"{raw}: {type(e).__name__}: {e}")
        return out

    def _after(self, func, raw, mutating, args, kwargs, out, tensors, versions, pre):
        outs = _tensors_in(out)
        changed = [t for t, v in zip(tensors, versions) if t._version != v]
        if mutating:
            if not isinstance(args[0], torch.Tensor) or "out" in kwargs:
                raise _CondError("an in-place op without a tensor to write")
            outs = [args[0]]
            write = [0]
        else:
            if changed or "out" in kwargs:
                raise _CondError("an op that is not in place changed its operands")
            if not outs:
                return
            ins = {t.untyped_storage().data_ptr() for t in tensors if t.numel()}
            # a view (or the operand itself) shares its operand's storage and so its marks
            write = [i for i, o in enumerate(outs) if o.numel() and o.untyped_storage().data_ptr() not in ins]
            if not write:
                return
        name, cargs = self._canon(func, raw, args, kwargs)
        if name in _FACTORIES:
            return  # a fresh storage: exact
        if name in _STRUCT:
            self._struct(name, func, args, kwargs, outs, write)
        elif name in _REDUCE:
            self._reduce(name, func, args, kwargs, outs, write)
        elif name in _MATMUL:
            self._matmul(func, args, kwargs, outs, write)
        elif name in _SELECT or name in _EXACT or name in _INEXACT:
            if len(outs) != 1:
                raise _CondError("a pointwise op with several results")
            self._pointwise(name, func, args, kwargs, cargs, outs[0], pre, mutating)
        else:
            raise _CondError("the conditioning rule does not know this op")

    @staticmethod
    def _canon(func, raw, args, kwargs):
        """(canonical name, operands in the canonical order)."""
        if raw in _REFLECTED:
            return _REFLECTED[raw], (args[1], args[0]) + tuple(args[2:])
        n = _DUNDER.get(raw, raw)
        if n.endswith("_") and not n.startswith("_"):
            n = n[:-1]
        n = _ALIAS.get(n, n)
        cargs = tuple(args)
        if n == "where" and _is_method(func):
            cargs = (args[1], args[0]) + tuple(args[2:])
        if n in ("max", "min"):
            other = args[1] if len(args) > 1 else kwargs.get("other")
            if isinstance(other, torch.Tensor):
                return ("maximum" if n == "max" else "minimum"), (args[0], other)
        return n, cargs

    # -- element movers ------------------------------------------------------------------------
    def _struct(self, name, func, args, kwargs, outs, write):
        only = {id(args[0])} if name in ("getitem", "expand_as", "view_as", "reshape_as") else None
        per_mark = []
        for i in range(3):
            def sub(t, i=i):
                return self.marks(t)[i] if only is None or id(t) in only else t
            r = _tensors_in(func(*_subst(args, sub), **_subst(kwargs, sub)))
            if len(r) != len(outs):
                raise _CondError("re-run on the marks gave another number of results")
            per_mark.append(r)
        for j in write:
            self._write(outs[j], per_mark[0][j], per_mark[1][j], per_mark[2][j])

    # -- pointwise ops -------------------------------------------------------------------------
    def _pointwise(self, name, func, args, kwargs, cargs, o, pre, mutating):
        shape = o.shape
        floating = o.is_floating_point()

        def val(t):
            return pre[id(t)] if pre is not None and isinstance(t, torch.Tensor) else t

        data = [args[0]] if name == "type_as" else _tensors_in((args, kwargs))
        M = {id(t): self.marks(t) for t in data}
        K = {id(t): self._kb(val(t), M[id(t)][0]) for t in data}

        def kb(x):
            return K[id(x)] if isinstance(x, torch.Tensor) and id(x) in K else torch.zeros((), dtype=F64)

        def V(x):
            return val(x).detach().double() if isinstance(x, torch.Tensor) else torch.tensor(float(x), dtype=F64)

        def bc(m):
            return torch.broadcast_to(m, shape)

        false = torch.zeros(shape, dtype=torch.bool)
        if name in _SELECT:
            inex, ill, zs = self._select_marks(name, cargs, kwargs, M, shape)
        else:
            ill = false.clone()
            for t in data:
                ill |= bc(M[id(t)][1])
            inex, zs = false.clone(), false.clone()
        if floating and name in _INEXACT:
            inex |= bc(self._own_inexact(name, cargs, M, val))

        discrete = not floating or name in _DISCRETE or (name == "div" and kwargs.get("rounding_mode") is not None)
        # Move the inexact operands to either end of their bands (every combination), and make
        # those within their bands of zero a zero of either sign (kiln's value may be one).
        movable = [t for t in data if t.is_floating_point() and bool((K[id(t)] > 0).any())]
        if movable:
            base = self._rerun(func, args, kwargs, {}, pre, mutating)
            mv, ms = false.clone(), false.clone()
            configs = []
            keys = {id(t): _element_key(t, shape) for t in movable}

            def directions(ts):  # every combination of directions, one per group of same elements
                groups = list(dict.fromkeys(keys[id(t)] for t in ts))
                for signs in itertools.product((-1.0, 1.0), repeat=len(groups)):
                    yield [(t, signs[groups.index(keys[id(t)])]) for t in ts]

            for ds in directions(movable):
                configs.append([(t, lambda v, k, s=s: torch.where(k > 0, (v.double() + s * k).to(v.dtype), v))
                                for t, s in ds])
            near0 = [t for t in movable if bool(((K[id(t)] >= val(t).detach().double().abs()) & (val(t) != 0)).any())]
            for ds in directions(near0):
                configs.append([(t, lambda v, k, s=s: torch.where((k >= v.double().abs()) & (v != 0),
                                                                    _signed_zero(s, v.dtype), v))
                                for t, s in ds])
            mj = false.clone()
            big = 2.0 ** (_MANTISSA.get(o.dtype, 53) - 1)
            for config in configs:
                repl = {id(t): f(val(t).detach(), K[id(t)]) for t, f in config}
                r = self._rerun(func, args, kwargs, repl, pre, mutating)
                dv, ds = _diff(r, base)
                mv |= dv
                ms |= ds
                if discrete and floating:
                    # past 2**(mantissa-1) every float is an integer: floor and co. are the
                    # identity there, and a move of the operand is no jump
                    bd, rd = base.detach().double(), r.detach().double()
                    smooth = bd.isfinite() & rd.isfinite() & (bd.abs() >= big) & (bd.sign() == rd.sign())
                    mj |= dv & ~smooth
            self._source(name, "a zero of either sign within the bands", ms & ~zs)
            zs |= ms
            if discrete:
                jumps = mj if floating else mv
                self._source(name, "a move within the bands crosses a jump", jumps & ~ill)
                ill |= jumps
                inex |= mv & ~jumps
            else:
                inex |= mv | ms
        # zeros of unspecified sign: re-run with them of either sign
        signed = [t for t in data if t.is_floating_point() and bool((M[id(t)][2] & (val(t) == 0)).any())]
        if signed:
            base = self._rerun(func, args, kwargs, {}, pre, mutating)
            for signs in itertools.product((-1.0, 1.0), repeat=len(signed)):
                repl = {}
                for t, s in zip(signed, signs):
                    v = val(t)
                    repl[id(t)] = torch.where(M[id(t)][2] & (v == 0), _signed_zero(s, v.dtype), v)
                dv, ds = _diff(self._rerun(func, args, kwargs, repl, pre, mutating), base)
                self._source(name, "a zero of unspecified sign changes its value", dv & ~ill)
                ill |= dv
                zs |= ds
        for reason, j in self._jumps(name, cargs, kwargs, kb, V, o, data, M, val):
            self._source(name, reason, j & ~ill)
            ill |= j
        t = self._ties(name, cargs, kwargs, V, o)
        self._source(name, "a tie of +0.0 and -0.0", t & ~zs)
        zs |= t
        self._write(o, inex, ill, zs)

    def _source(self, name, what, m):
        if bool(m.any()):
            self.sources.append((name, what))

    @staticmethod
    def _rerun(func, args, kwargs, repl, pre, mutating):
        """func on the operands' values before the call, some replaced (repl: id -> tensor); an
        in-place op writes into a copy."""
        def sub(t):
            r = repl.get(id(t))
            if r is None:
                r = pre[id(t)] if pre is not None else t
            return r
        a, kw = _subst(tuple(args), sub), _subst(kwargs, sub)
        if mutating:
            target = a[0].clone()
            func(target, *a[1:], **kw)
            return target
        return func(*a, **kw)

    def _select_marks(self, name, cargs, kwargs, M, shape):
        def m(x, i):
            return M[id(x)][i] if isinstance(x, torch.Tensor) else False
        res = []
        for i in range(3):
            if name == "where":
                c, a, b = cargs[0], cargs[1], cargs[2]
                r = torch.where(c, m(a, i), m(b, i))
                if i == 1:
                    r = r | m(c, 1)
            elif name == "masked_fill":
                x, mask = cargs[0], cargs[1]
                value = cargs[2] if len(cargs) > 2 else kwargs.get("value")
                r = M[id(x)][i].clone().masked_fill_(mask, m(value, i))
                if i == 1:
                    r = r | m(mask, 1)
            elif name == "setitem":
                x, idx, value = cargs[0], cargs[1], cargs[2]
                r = M[id(x)][i].clone()
                r[idx] = m(value, i)
            elif name == "copy":
                r = torch.broadcast_to(torch.as_tensor(m(cargs[1], i)), shape)
            elif name == "fill":
                r = torch.broadcast_to(torch.as_tensor(m(cargs[1], i)), shape)
            else:  # zero
                r = torch.zeros(shape, dtype=torch.bool)
            res.append(torch.broadcast_to(torch.as_tensor(r), shape).clone())
        return res

    @staticmethod
    def _own_inexact(name, cargs, M, val):
        """Where the op itself may round differently (for exact operands)."""
        if name == "atan2":
            return torch.ones((), dtype=torch.bool)
        if name == "pow":
            base, ex = cargs[0], cargs[1]
            if not isinstance(ex, torch.Tensor):
                if ex in (0, 1, 2):
                    return torch.zeros((), dtype=torch.bool)
                exact = torch.zeros((), dtype=torch.bool)
            else:
                exact = (val(ex) == 0) & ~M[id(ex)][0]
            if isinstance(base, torch.Tensor):
                exact = exact | ((val(base) == 1) & ~M[id(base)][0])
            elif base == 1:
                return torch.zeros((), dtype=torch.bool)
            return ~exact
        x = cargs[0]
        v = val(x).detach().double()
        special = v.isnan()
        if name != "softplus":
            special = special | (v == 0)
        if name in ("log", "log2", "log10"):
            special = special | (v == 1)
        if name == "exp2":  # a power of two (normal range)
            special = special | ((v == v.round()) & (v.abs() < 126))
        if name not in ("atan", "gelu"):
            special = special | v.isinf()
        return ~(special & ~M[id(x)][0])

    def _jumps(self, name, cargs, kwargs, kb, V, o, data, M, val):
        """Ill-conditioned elements that moving the operands cannot show, as [(reason, mask)]:
        isolated jumps (==, !=, truth values), remainder/fmod's jumps and cancellation, poles
        and domain edges."""
        shape = o.shape
        found = []

        def flag(reason, m):
            found.append((reason, torch.broadcast_to(m, shape)))

        def near(x, at=0.0):  # the band of an inexact x holds `at`
            k = kb(x)
            return (k > 0) & ((V(x) - at).abs() <= k)

        def same(x, y):  # the same numbers on both sides move together: x == x, x % x stay put
            return isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and \
                _element_key(x, shape) == _element_key(y, shape)

        if name in ("eq", "ne") and not same(cargs[0], cargs[1]):
            x, y = cargs[0], cargs[1]
            s = kb(x) + kb(y)
            flag("operands within each other's bands", (s > 0) & ((V(x) - V(y)).abs() <= s))
        truth = name in ("logical_and", "logical_or", "logical_xor", "logical_not") or \
            (o.dtype == BOOL and name in _CASTS | {"copy", "setitem", "fill"})
        if truth:
            if name == "setitem":
                x, idx, value = cargs[0], cargs[1], cargs[2]
                if isinstance(value, torch.Tensor) and value.is_floating_point():
                    r = torch.zeros(x.shape, dtype=torch.bool)
                    r[idx] = near(value)
                    flag("a truth value within the bands", r)
            else:
                for t in (data if name != "copy" else [cargs[1]]):
                    if isinstance(t, torch.Tensor) and t.is_floating_point():
                        flag("a truth value within the bands", near(t))
        if name in ("remainder", "fmod") and o.is_floating_point() and not same(cargs[0], cargs[1]):
            x, y = cargs[0], cargs[1]
            kx, ky = kb(x), kb(y)
            if bool((kx > 0).any()) or bool((ky > 0).any()):
                xv, yv = V(x), V(y)
                q = xv / yv
                n = q.round()
                reach = kx + n.abs() * ky  # how far x and the jump at n*y may move towards each other
                at_jump = ((q - n).abs() * yv.abs() <= reach) & (reach > 0)
                if name == "fmod":
                    at_jump &= n != 0  # fmod is continuous through 0
                flag("a multiple of the divisor within the bands", at_jump)
                m = q.floor() if name == "remainder" else q.trunc()
                rtol, atol = TOL.get(o.dtype, (1e-5, 1e-6))
                # one band of the operands, carried through x - m*y, against the result's tolerance
                flag("cancellation: a band of the operands exceeds the result's tolerance",
                     (kx + m.abs() * ky) / self.k > rtol * o.detach().double().abs() + atol)
                flag("a divisor within its band of zero", near(y))
        if name == "div" and kwargs.get("rounding_mode") is None:
            x, y = cargs[0], cargs[1]
            flag("a divisor within its band of zero", near(y) | ((V(y) == 0) & near(x)))
        if name in ("reciprocal", "rsqrt"):
            flag("a divisor within its band of zero", near(cargs[0]))
        if name in ("sqrt", "log", "log2", "log10"):
            flag("an argument within its band of the domain's edge", near(cargs[0]))
        if name == "log1p":
            flag("an argument within its band of the domain's edge", near(cargs[0], -1.0))
        if name == "pow":
            b, e = cargs[0], cargs[1]
            ev = V(e)
            odd_exp = (ev < 0) | (ev != ev.round()) | (kb(e) > 0)
            flag("a base within its band of zero", near(b) & odd_exp)
            flag("an exponent of a negative base within its band of an integer",
                 (kb(e) > 0) & (V(b) < 0) & ((ev - ev.round()).abs() <= kb(e)))
        if name == "atan2":
            y, x = cargs[0], cargs[1]
            flag("atan2's branch cut within the bands",
                 (near(y) & (V(x) < kb(x))) | (((kb(x) + kb(y)) > 0) & (V(x).abs() <= kb(x)) & (V(y).abs() <= kb(y))))
        return found

    @staticmethod
    def _ties(name, cargs, kwargs, V, o):
        """Zeros whose sign torch leaves to the kernel: maximum/minimum (and clamp with tensor
        bounds) of +0.0 against -0.0."""
        shape = o.shape
        zs = torch.zeros(shape, dtype=torch.bool)
        if not o.is_floating_point():
            return zs
        pairs = []
        if name in ("maximum", "minimum"):
            pairs.append((cargs[0], cargs[1]))
        elif name in ("clamp", "clamp_min", "clamp_max"):
            bounds = list(cargs[1:3]) + [kwargs.get("min"), kwargs.get("max")]
            pairs += [(cargs[0], b) for b in bounds if isinstance(b, torch.Tensor)]
        for a, b in pairs:
            av, bv = V(a), V(b)
            zs |= torch.broadcast_to((av == 0) & (bv == 0) & (av.signbit() != bv.signbit()), shape)
        return zs & (o == 0)

    # -- reductions ----------------------------------------------------------------------------
    def _reduce(self, name, func, args, kwargs, outs, write):
        x = args[0]
        if not isinstance(x, torch.Tensor):
            raise _CondError("a reduction of a non-tensor")
        inex_x, ill_x, zs_x = self.marks(x)
        kb = self._kb(x, inex_x)
        xd = x.detach().double()

        def call(sub):
            kw = dict(kwargs)
            if "dtype" in kw:
                kw["dtype"] = F64
            r = func(sub, *args[1:], **kw)
            return list(r) if isinstance(r, tuple) else [r]

        def dims():
            d = args[1] if len(args) > 1 else kwargs.get("dim")
            keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
            return d, bool(keep)

        def any_over(m):
            """Per result: whether its slice of x holds an element of bool mask m."""
            md = m.double()
            if name in ("sum", "nansum", "mean"):
                r = [t > 0 for t in call(md)]
            elif name in ("amax", "max"):
                r = [call(md)[0] > 0] * len(outs)
            elif name in ("amin", "min"):
                r = [call(-md)[0] < 0] * len(outs)
            elif name == "prod":
                r = [call(1.0 + md)[0] > 1]
            elif name == "logsumexp":
                r = [call(torch.where(m, 0.0, -math.inf))[0] > -math.inf]
            elif name in ("std", "var", "softmax", "log_softmax"):
                hit = call(torch.where(m, math.nan, 0.0))[0].isnan()
                r = [hit & ~call(torch.zeros_like(md))[0].isnan()]
            elif name == "any":
                r = [call(m)[0]]
            elif name == "all":
                r = [~call(~m)[0]]
            else:  # argmax, argmin
                d, keep = dims()
                if d is None:
                    a = m.any()
                    r = [a.reshape([1] * x.dim()) if keep else a]
                else:
                    r = [(m.reshape(1) if x.dim() == 0 else m).any(d, keepdim=keep).reshape(outs[0].shape)]
            for t, o in zip(r, outs):
                if t.shape != o.shape:
                    raise _CondError(f"marks of shape {tuple(t.shape)} for a result of shape {tuple(o.shape)}")
            return r

        o0 = outs[0]
        if name in ("softmax", "log_softmax"):
            d = args[1] if len(args) > 1 else kwargs.get("dim")
            count = x.shape[d] if x.dim() else 1
        else:
            count = x.numel() // o0.numel() if o0.numel() else 0
        own = False
        if o0.is_floating_point() and count > 1:
            if name in ("sum", "nansum"):
                # a sum of at most one nonzero term is that term in any order
                own = False if _exact_sum(x, o0.dtype, lambda t: call(t)[0]) else call((xd != 0).double())[0] > 1
            elif name == "mean":
                own = not (_exact_sum(x, o0.dtype, lambda t: call(t)[0] * count) and count & (count - 1) == 0)
            elif name == "prod":
                own = not _exact_prod(x, o0.dtype, lambda t: call(t)[0])
            elif name in ("std", "var", "logsumexp", "softmax", "log_softmax"):
                own = True
        ill = any_over(ill_x)
        inex = any_over(inex_x)
        if name in ("std", "var", "softmax", "log_softmax") and count <= 1:
            # one element: nan or 0 (std, var), 1 or 0 (softmax, log_softmax) whatever its value
            inex = [torch.zeros(o.shape, dtype=torch.bool) for o in outs]
        if x.is_floating_point():
            near0 = (kb > 0) & (xd.abs() <= kb)
            if name in ("sum", "nansum", "mean", "prod", "amax", "amin", "max", "min"):
                # the sign of a zero sum, product or max follows the signs of the zeros in its slice
                zs = any_over((zs_x & (xd == 0)) | (near0 & (xd != 0)))
                self._source(name, "a zero of either sign within the bands",
                             zs[0] & (o0 == 0) & ~any_over(zs_x & (xd == 0))[0])
            else:
                zs = [torch.zeros(o.shape, dtype=torch.bool) for o in outs]
            if name in ("any", "all"):
                t = any_over(near0)
                self._source(name, "a truth value within the bands", t[0] & ~ill[0])
                ill = [a | b for a, b in zip(ill, t)]
            if name in ("sum", "nansum") and not o0.is_floating_point():
                lo = (xd - kb).to(o0.dtype)
                hi = (xd + kb).to(o0.dtype)
                t = any_over((kb > 0) & (lo != hi))
                self._source(name, "a cast within the bands crosses a jump", t[0] & ~ill[0])
                ill = [a | b for a, b in zip(ill, t)]
            if name in ("amax", "amin", "max", "min") and o0.is_floating_point():
                pos, neg = any_over((xd == 0) & ~xd.signbit()), any_over((xd == 0) & xd.signbit())
                self._source(name, "a tie of +0.0 and -0.0", pos[0] & neg[0] & (o0 == 0))
                zs = [z | (p & n) for z, p, n in zip(zs, pos, neg)]
        else:
            zs = [torch.zeros(o.shape, dtype=torch.bool) for o in outs]
        if name in ("argmax", "argmin") or (name in ("max", "min") and len(outs) == 2):
            d, keep = dims()
            j = len(outs) - 1
            t = self._index_ties(xd, kb, outs[j], d, keep)
            self._source(name, "another candidate within the bands of the one picked", t & ~ill[j])
            ill[j] = ill[j] | t
        for j in write:
            o = outs[j]
            f = o.is_floating_point()
            self._write(o, (inex[j] | own) if f else False, ill[j], (zs[j] & (o == 0)) if f else False)

    @staticmethod
    def _index_ties(xd, kb, idx, d, keep):
        """Where another element of the slice is within the bands of the one argmax/argmin picked."""
        if d is None or xd.dim() == 0:
            xs, ks, dim, ik = xd.reshape(-1), kb.reshape(-1), 0, idx.reshape(1)
        else:
            dim = d % xd.dim()
            xs, ks, ik = xd, kb, (idx if keep else idx.unsqueeze(dim))
        w, kw = xs.gather(dim, ik), ks.gather(dim, ik)
        close = ((xs - w).abs() <= ks + kw) & ((ks + kw) > 0)
        close = close.scatter(dim, ik, False)
        return close.any(dim, keepdim=True).reshape(idx.shape)

    # -- matmul --------------------------------------------------------------------------------
    def _matmul(self, func, args, kwargs, outs, write):
        a, b = args[0], args[1]
        ma, mb = self.marks(a), self.marks(b)
        o = outs[0]
        ones_a, ones_b = torch.ones(a.shape, dtype=F64), torch.ones(b.shape, dtype=F64)

        def dep(x, y):
            return (func(x.double(), ones_b, **kwargs) + func(ones_a, y.double(), **kwargs)) > 0

        ill = dep(ma[1], mb[1])
        if o.is_floating_point():
            k = a.shape[-1] if a.dim() else 1
            own = False
            if k > 1:
                ad, bd = a.detach().double(), b.detach().double()
                grid = all(bool((v * 16 == (v * 16).round()).all()) for v in (ad[ad.isfinite()], bd[bd.isfinite()]))
                bound = func(ad.abs(), bd.abs(), **kwargs)
                exact = grid and o.dtype in _MANTISSA and bool(bound.isfinite().all()) \
                    and float(bound.max() if bound.numel() else 0.0) * 256 < 2.0 ** _MANTISSA[o.dtype]
                # else: a result with at most one nonzero product is that product in any order
                own = False if exact else func((ad != 0).double(), (bd != 0).double(), **kwargs) > 1
            kba, kbb = self._kb(a, ma[0]), self._kb(b, mb[0])
            za = (ma[2] & (a == 0)) | ((kba > 0) & (a.detach().double().abs() <= kba) & (a != 0))
            zb = (mb[2] & (b == 0)) | ((kbb > 0) & (b.detach().double().abs() <= kbb) & (b != 0))
            zs = (o == 0) & dep(za, zb)
            self._source("matmul", "a zero of either sign within the bands",
                         zs & ~dep(ma[2] & (a == 0), mb[2] & (b == 0)))
            self._write(o, dep(ma[0], mb[0]) | own, ill, zs)
        else:
            self._write(o, False, ill, False)


# ---------------------------------------------------------------------------------------------
# Running one program
# ---------------------------------------------------------------------------------------------

@dataclass
class Result:
    seed: int
    source: str
    inputs: str
    invalid: bool
    failures: list
    eager_raised: list          # per input set: eager's exception (str) or None
    ran_eagerly: bool = False   # kiln fell back to eager for a call whose eager run succeeded
    graph_breaks: int = 0
    fallback_reasons: dict = field(default_factory=dict)
    seconds: float = 0.0
    # The conditioning rule (see Conditioning), over the input sets whose results were compared:
    uncompared_values: int = 0      # elements whose value was ill-conditioned and not compared
    uncompared_zero_signs: int = 0  # elements whose sign of zero only was not compared
    uncompared_differed: int = 0    # of those, elements where kiln did differ from eager
    ill_sources: list = field(default_factory=list)  # "op: reason" where they became so

    def to_json(self):
        d = dataclasses.asdict(self)
        return d

    @staticmethod
    def from_json(d):
        d = dict(d)
        d["failures"] = [Failure(**f) for f in d["failures"]]
        return Result(**d)


def check_program(prog: Program, check_strides: bool = True) -> Result:
    """Eager against kiln on three input sets; see the module docstring."""
    import kiln

    t0 = time.time()
    fails: list = []
    eager_raised = []
    ran_eagerly = False
    breaks = 0
    reasons: dict = {}
    fn_eager = compile_source(prog.source, filename=f"<kiln-fuzz seed {prog.seed}>")
    fn_kiln = compile_source(prog.source, filename=f"<kiln-fuzz seed {prog.seed}>")
    compiled = kiln.compile(fn_kiln, backend=BACKEND)
    names = "abc"
    tally = {"values": 0, "zero_signs": 0, "differed": 0}
    sources: set = set()
    for which in range(3):
        eager_in = make_inputs(prog.inputs, prog.seed, which)
        kiln_in = make_inputs(prog.inputs, prog.seed, which)
        e_exc = k_exc = None
        exp = act = None
        # the conditioning rule watches the eager run (only where floats are compared within
        # TOL: the eager backend runs torch's own kernels and must match bit for bit)
        cond = Conditioning() if BACKEND == "inductor" else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                if cond is not None:
                    with cond:
                        exp = fn_eager(*eager_in)
                else:
                    exp = fn_eager(*eager_in)
            except Exception as e:  # noqa: BLE001
                e_exc = e
            before = kiln.stats()
            try:
                act = compiled(*kiln_in)
            except Exception as e:  # noqa: BLE001
                k_exc = e
            after = kiln.stats()
        eager_raised.append(_exc_str(e_exc) if e_exc else None)
        fb = after["eager_fallbacks"] - before["eager_fallbacks"]
        breaks += after["graph_breaks"] - before["graph_breaks"]
        for k, v in after["fallback_reasons"].items():
            dv = v - before["fallback_reasons"].get(k, 0)
            if dv:
                reasons[k] = reasons.get(k, 0) + dv
        if fb and e_exc is None:
            ran_eagerly = True
        out: list = []
        for p in (cond.problems if cond is not None else [])[:3]:
            out.append(Failure(HARNESS, f"the conditioning rule could not follow eager's run: {p}"))
        before_tally = dict(tally)
        if e_exc is not None and k_exc is not None:
            if type(e_exc) is not type(k_exc):
                out.append(Failure(EXC_TYPE, f"kiln raised {_exc_str(k_exc)}{_where(k_exc, prog.source)}\n"
                                             f"      eager raised {_exc_str(e_exc)}{_where(e_exc, prog.source)}"))
            elif _norm_msg(e_exc) != _norm_msg(k_exc):
                out.append(Failure(EXC_MSG, f"kiln: {_exc_str(k_exc)}\n      eager: {_exc_str(e_exc)}"))
            inp: list = []
            for i, (ka, ea) in enumerate(zip(kiln_in, eager_in)):
                compare(ka, ea, f"input {names[i]}", inp, False, cond, tally)
            for f in inp:
                out.append(Failure(INPUTS_AFTER_EXC, f"{f.category}: {f.detail}"))
        elif k_exc is not None:
            out.append(Failure(KILN_RAISED, f"kiln raised {_exc_str(k_exc)}{_where(k_exc, prog.source)}"))
        elif e_exc is not None:
            out.append(Failure(EAGER_RAISED, f"eager raised {_exc_str(e_exc)}{_where(e_exc, prog.source)}; "
                                             f"kiln returned {_summ(act)}"))
        else:
            compare(act, exp, "out", out, check_strides, cond, tally)
            for i, (ka, ea) in enumerate(zip(kiln_in, eager_in)):
                compare(ka, ea, f"input {names[i]} after the call", out, False, cond, tally)
        if cond is not None and tally != before_tally:
            sources.update(f"{op}: {why}" for op, why in cond.sources)
        seen = set()
        for f in out:
            if f.category in seen:
                continue  # one failure per category and input set
            seen.add(f.category)
            f.which = which
            fails.append(f)
    kiln.reset()
    return Result(prog.seed, prog.source, prog.describe_inputs(), prog.invalid, fails, eager_raised,
                  ran_eagerly, breaks, reasons, time.time() - t0, tally["values"], tally["zero_signs"],
                  tally["differed"], sorted(sources))


def _where(exc: BaseException, source: str) -> str:
    """' (at line N: <statement>)' for the innermost frame of the generated program in exc's
    traceback, '' if there is none (kiln raised from its own code)."""
    lines = source.splitlines()
    where = ""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith("<kiln-fuzz"):
            n = tb.tb_lineno
            if 1 <= n <= len(lines):
                where = f" (at line {n}: {lines[n - 1].strip()})"
        tb = tb.tb_next
    return where


def _indent(s: str) -> str:
    return "\n".join("      " + line for line in s.rstrip().splitlines())


def _summ(x) -> str:
    if _is_tensor(x):
        return f"Tensor{tuple(x.shape)} {x.dtype}"
    if isinstance(x, (tuple, list)):
        return type(x).__name__ + "(" + ", ".join(_summ(y) for y in x) + ")"
    return repr(x)[:80]


def check_seed(seed: int, check_strides: bool = True) -> Result:
    try:
        prog = generate(seed)
    except Exception:  # noqa: BLE001
        return Result(seed, "<generation failed>", "", False,
                      [Failure(HARNESS, "generator raised:\n" + _indent(traceback.format_exc()))], [])
    try:
        return check_program(prog, check_strides)
    except Exception:  # noqa: BLE001
        return Result(seed, prog.source, prog.describe_inputs(), prog.invalid,
                      [Failure(HARNESS, "runner raised:\n" + _indent(traceback.format_exc()))], [])


# ---------------------------------------------------------------------------------------------
# Child processes
# ---------------------------------------------------------------------------------------------

def _worker_main(argv):
    """python _fuzz.py worker [--no-strides] SEED...: one JSON line per seed on stdout, a
    {"start": seed} line flushed before each, so a parent knows which seed a crash was in."""
    import faulthandler
    faulthandler.enable()  # a crash's Python traceback goes to stderr
    strides = "--no-strides" not in argv
    seeds = [int(a) for a in argv if not a.startswith("--")]
    warnings.simplefilter("ignore")
    out = sys.stdout
    for s in seeds:
        out.write(json.dumps({"start": s}) + "\n")
        out.flush()
        res = check_seed(s, strides)
        out.write(json.dumps({"result": res.to_json()}) + "\n")
        out.flush()
    out.write(json.dumps({"finished": True}) + "\n")
    out.flush()


def _describe_rc(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with status {rc}"


def _child_env():
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("KILN_DEBUG", None)
    env.pop("KILN_LOGS", None)
    return env


def run_batch(seeds, *, check_strides=True, timeout_per_seed=120.0, on_result=None) -> list:
    """Checks `seeds` in child interpreters: returns a Result per seed. A child that dies
    (signal, abort, exit) or hangs past timeout_per_seed gives the seed it was running a
    CRASH result; the seeds after it go on in a new child."""
    results: list = []
    todo = list(seeds)
    env = _child_env()
    while todo:
        cmd = [sys.executable, os.path.abspath(__file__), "worker"] + (["--no-strides"] if not check_strides else []) \
            + [str(s) for s in todo]
        with tempfile.TemporaryFile(mode="w+") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
            current = [None, time.time()]
            timed_out = [False]
            stop = threading.Event()

            def watchdog():
                while not stop.wait(1.0):
                    if current[0] is not None and time.time() - current[1] > timeout_per_seed:
                        timed_out[0] = True
                        proc.kill()
                        return

            th = threading.Thread(target=watchdog, daemon=True)
            th.start()
            done = set()
            for line in proc.stdout:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if "start" in msg:
                    current[0], current[1] = msg["start"], time.time()
                elif "result" in msg:
                    res = Result.from_json(msg["result"])
                    results.append(res)
                    done.add(res.seed)
                    current[0] = None
                    if on_result:
                        on_result(res)
            rc = proc.wait()
            stop.set()
            th.join()
            err.seek(0)
            stderr = err.read()
        crashed = current[0]
        todo = [s for s in todo if s not in done]
        if not todo:
            break
        if crashed is None:
            crashed = todo[0]  # died between seeds (or at start): blame the next one
        what = f"timed out after {timeout_per_seed:g} s" if timed_out[0] else _describe_rc(rc)
        try:
            prog = generate(crashed)
            src, inputs, invalid = prog.source, prog.describe_inputs(), prog.invalid
        except Exception:  # noqa: BLE001
            src, inputs, invalid = "<generation failed>", "", False
        tail = "\n".join(stderr.strip().splitlines()[-25:])
        res = Result(crashed, src, inputs, invalid, [Failure(CRASH, f"child {what}\n{_indent(tail)}")], [])
        results.append(res)
        if on_result:
            on_result(res)
        todo = [s for s in todo if s != crashed]
    return results


def format_result(res: Result, ignore=()) -> str:
    fails = [f for f in res.failures if f.category not in ignore]
    sets = ("first inputs", "fresh values", "different sizes")
    lines = [f"=== seed {res.seed}: " + ", ".join(sorted({f.category for f in fails}))
             + (" (deliberately invalid program)" if res.invalid else "")]
    lines.append(res.source.rstrip())
    lines.append("inputs:\n" + res.inputs)
    for f in fails:
        lines.append(f"  [{f.category}] ({sets[f.which]}) {f.detail}")
    if res.uncompared_values or res.uncompared_zero_signs:
        lines.append(f"  (conditioning rule: {res.uncompared_values} ill-conditioned values and "
                     f"{res.uncompared_zero_signs} signs of zero not compared: {'; '.join(res.ill_sources)})")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        _worker_main(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "show":
        for a in sys.argv[2:]:
            p = generate(int(a))
            print(p.reproducer())
    else:
        print("usage: _fuzz.py worker SEED... | show SEED...", file=sys.stderr)
        sys.exit(2)
