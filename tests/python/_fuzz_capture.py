"""Differential fuzzing of kiln's capture of Python programs around tensors: a program generator
and a runner.

Library code shared by ``tests/python/test_fuzz_capture.py`` (a few fixed seeds in CI) and
``bench/fuzz_capture.py`` (thousands of seeds from the command line). Nothing here is a test.

Where ``_fuzz.py`` fuzzes tensor *ops*, this fuzzes the *Python* TorchDynamo-style capture must
get right. ``generate(seed)`` emits the source of a module holding a function ``f(x, y, state)``
(x, y float tensors of one shape; ``state`` a caller-owned dict, list or object) and the helpers
it calls (a user class with ``__init__``, methods, a property and a class attribute; a custom
exception; a ``contextlib.contextmanager``; a generator; a function for ``functools.partial``;
a module-level ``io.StringIO`` that ``print`` writes to; a global counter). The body mixes
arithmetic on tensors and Python numbers, if/elif on Python values and tensor shapes, for and
while loops (range, lists, dict items, enumerate, zip, itertools, generators), building and
mutating local and caller containers, comprehensions, closures with ``nonlocal``, lambdas,
try/except/else/finally around code that raises (KeyError, IndexError, ValueError, a custom
exception), ``with`` blocks, ``math``/``operator``/``itertools``/``functools``, and now and then
a graph break (print, ``torch._dynamo.graph_break()``, ``.item()`` in control flow, ``.tolist()``).
A second round of statements adds while loops with break/continue/else, for-else searches,
nested functions with defaults, keyword-only and positional-only parameters, *args/**kwargs
calls, star-unpacking and swaps, walrus (in conditions and comprehensions), f-strings over
shapes, dtypes and ``.item()``, str iteration/split/join/format/%, dicts built while iterating
another, live dict views (keys/values/items) in loops and set operations, sorted/min/max with
key= and default=, any/all, loops over lists mutated in their own body, list methods
(sort(key=), reverse, insert, extend, remove, index, count, extended-slice stores), tuple
comparisons, tensor slices with steps and negative indices, generators driven by send(),
throw(), close() and StopIteration.value, ``yield from`` with return values, class inheritance
with super(), classmethods (writing a class attribute), staticmethods and property setters,
user objects with __eq__/__hash__ as dict keys and set items, dataclasses (frozen, defaults
factories, __post_init__, replace/asdict/astuple/fields, FrozenInstanceError), namedtuples
(collections and typing, _replace/_asdict/_make), nested try/except/else/finally with bare
re-raise and ``raise ... from``, no_grad/enable_grad nesting, ``torch.autocast('cpu',
bfloat16)`` around matmuls, managers that swallow exceptions, closure counters, a
``global`` in a nested function, a module-level list, lru_cache/cache helpers, in-place updates
of the caller's x and y (add_, indexed stores, index_put_, masked_fill_, through views),
tensor methods that return Python values (.shape, .dim(), .numel(), .stride(), .tolist(),
.item(), .nonzero()) and ``backward()``/``torch.autograd.grad`` inside the function (the
inputs' ``.grad`` is compared too).
It returns tuples, dicts and nested containers. Every name has one kind (tensor, 0-d tensor,
int, float, bool, str, list of ints, list of tensors, dict, set, object) for its whole life and
containers are only indexed where that cannot fail, so programs are valid by construction; the
generator still runs each candidate eagerly and draws again if it raised something it did not
mean to. About one program in twelve ends by raising on purpose (its exception is compared).

``check_program(prog)`` writes the source to two real module files (one for eager, one for
kiln: module globals, class attributes and the print buffer are separate and compared too),
then calls ``f`` three times on each side, on identical inputs built by the module's own
``make_state``: (1) the first input set; (2) fresh x, y of the same shape with the state the
first call left (a caller's cache that persists); (3) x, y of another shape and a fresh state.
It compares results (values, dtypes, shapes, requires_grad, Python types, nesting, dict key
order, which results *are* the caller's objects), the caller's state, x and y after each call,
the module globals, and raised exceptions (type and message).
"""
from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import math
import os
import random
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

BACKEND = os.environ.get("KILN_FUZZ_BACKEND", "eager")
EXTRA = os.environ.get("KILN_FUZZ_EXTRA") == "1"  # third-round statement kinds (changes every seed)

# ---------------------------------------------------------------------------------------------
# Failure categories
# ---------------------------------------------------------------------------------------------

CRASH = "crash"
RESULT = "wrong result"
STATE = "wrong caller state"
INPUTS = "wrong inputs after call"
GLOBALS = "wrong module globals"
IDENTITY = "wrong identity"
EXC_TYPE = "exception type mismatch"
EXC_MSG = "exception message mismatch"
KILN_RAISED = "kiln raised where eager didn't"
EAGER_RAISED = "eager raised where kiln didn't"
DYNAMO = "more graphs than dynamo"
FALLBACK = "ran eagerly where dynamo captured"
HARNESS = "harness error"
CATEGORIES = (CRASH, RESULT, STATE, INPUTS, GLOBALS, IDENTITY, KILN_RAISED, EAGER_RAISED,
              EXC_TYPE, EXC_MSG, FALLBACK, DYNAMO, HARNESS)
SHORT = {"crash": CRASH, "result": RESULT, "state": STATE, "inputs": INPUTS, "globals": GLOBALS,
         "identity": IDENTITY, "exception": EXC_TYPE, "message": EXC_MSG, "kiln-raised": KILN_RAISED,
         "eager-raised": EAGER_RAISED, "dynamo": DYNAMO, "fallback": FALLBACK, "harness": HARNESS}
# categories that are not correctness bugs (reported, but not failures by default)
SOFT = {DYNAMO, FALLBACK}

# exceptions a program may raise on purpose (anything else from eager: the generator draws again)
MEANT = ("FuzzError", "KeyError", "IndexError", "ValueError")

# ---------------------------------------------------------------------------------------------
# The generator
# ---------------------------------------------------------------------------------------------

T, S, I, F, B, STR, L, LT, D, Z, O = "T", "S", "I", "F", "B", "STR", "L", "LT", "D", "Z", "O"

HEADER = '''\
import collections
import contextlib
import dataclasses
import functools
import io
import itertools
import math
import operator
import typing

import torch

_buf = io.StringIO()
_hits = 0
_calls = []


class FuzzError(Exception):
    pass


class Acc:
    scale = {scale}
    kind = "acc"

    def __init__(self, t, n={n0}):
        self.t = t
        self.n = n
        self.hist = []

    def add(self, v):
        self.t = self.t {op} v
        self.n += 1
        self.hist.append(self.n)
        return self

    def bump(self, k):
        self.n = self.n + k
        return self.n

    @property
    def total(self):
        return self.t.sum() * self.scale

    @property
    def count(self):
        return self.n + len(self.hist)


class State:
    def __init__(self, count, log, cache, scale, buf):
        self.count = count
        self.log = log
        self.cache = cache
        self.scale = scale
        self.buf = buf

    def bump(self, k):
        self.count += k
        return self.count

    @property
    def total(self):
        return self.count * self.scale


@contextlib.contextmanager
def tracking(log, tag):
    log.append("enter " + tag)
    try:
        yield len(log)
    finally:
        log.append("exit " + tag)


class Scope:
    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("in")
        return self

    def __exit__(self, *exc):
        self.log.append("out")
        return False


def steps(t, n):
    for i in range(n):
        yield t * (i + 1)


def pairs(d):
    for k in sorted(d):
        yield k, d[k]


def combine(a, b, alpha=1.0, beta=0.5):
    return a * alpha + b * beta


def check(n, limit):
    if n > limit:
        raise FuzzError(f"too big: {{n}} > {{limit}}")
    return n


def lookup(d, k):
    return d[k]


def make_inputs(which, requires_grad):
    g = torch.Generator().manual_seed({seed} * 7 + which)
    shape = {shapes}[which]
    x = torch.randn(shape, generator=g)
    y = torch.randn(shape, generator=g)
    if requires_grad:
        x.requires_grad_(True)
    count = int(torch.randint(0, 6, (1,), generator=g))
    log = [int(v) for v in torch.randint(0, 5, (int(torch.randint(0, 4, (1,), generator=g)),), generator=g)]
    cache = {{"a": 1, "b": 2}} if which != 1 else {{"b": 3, "c": 4}}
    scale = float(torch.rand((1,), generator=g)) + 0.5
    buf = torch.randn(shape, generator=g)
    kind = "{state_kind}"
    if kind == "dict":
        state = {{"count": count, "log": log, "cache": cache, "scale": scale, "buf": buf}}
    elif kind == "list":
        state = [count, log, cache, scale, buf]
    else:
        state = State(count, log, cache, scale, buf)
    return x, y, state


class Base:
    made = 0
    tag = "base"

    def __init__(self, t, k=1):
        self.t = t
        self.k = k
        self._w = 1.0

    def value(self):
        return self.t * self.k

    def describe(self):
        return f"{{self.tag}}:{{self.k}}"

    @classmethod
    def make(cls, t):
        cls.made += 1
        return cls(t, 2)

    @staticmethod
    def twice(v):
        return v * 2

    @property
    def w(self):
        return self._w

    @w.setter
    def w(self, v):
        self._w = float(v) * 2


class Child(Base):
    tag = "child"

    def __init__(self, t, k=1, off=0.5):
        super().__init__(t, k)
        self.off = off

    def value(self):
        return super().value() + self.off * self.w

    def describe(self):
        return "c/" + super().describe()


class Key:
    def __init__(self, a, b):
        self.a = a
        self.b = b

    def __eq__(self, other):
        return isinstance(other, Key) and (self.a, self.b) == (other.a, other.b)

    def __hash__(self):
        return hash((self.a, self.b))


@dataclasses.dataclass
class Cfg:
    n: int
    scale: float = 1.0
    tags: list = dataclasses.field(default_factory=list)

    def __post_init__(self):
        if self.n < 0:
            self.n = -self.n
        self.tags.append(self.n)


@dataclasses.dataclass(frozen=True)
class Pt:
    a: int
    b: int = 0

    def norm1(self):
        return abs(self.a) + abs(self.b)


@dataclasses.dataclass
class Box:
    t: torch.Tensor
    w: float = 1.0

    def __post_init__(self):
        self.s = self.t.sum() * self.w


Pair = collections.namedtuple("Pair", ["a", "b"], defaults=[0])


class TP(typing.NamedTuple):
    t: torch.Tensor
    k: int = 1

    def scaled(self):
        return self.t * self.k


class Swallow:
    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append(-1)
        return self

    def __exit__(self, et, ev, tb):
        self.log.append(0 if et is None else len(et.__name__))
        return et is not None and issubclass(et, LookupError)


@contextlib.contextmanager
def guarded(log):
    try:
        yield len(log)
    except ValueError as e:
        log.append(len(str(e)))
    finally:
        log.append(7)


def averager():
    total = 0.0
    count = 0
    avg = None
    while True:
        v = yield avg
        if v is None:
            break
        total += v
        count += 1
        avg = total / count
    return total, count


def tensor_acc(t):
    acc = t
    while True:
        k = yield acc
        if k is None:
            return acc
        acc = acc * 0.5 + k


def counted(t, n):
    for i in range(n):
        yield t + i
    return n * 10


def relay(t, n):
    r = yield from counted(t, n)
    yield t * r
    yield from steps(t, 2)


def make_counter(start):
    n = start

    def inc(k=1):
        nonlocal n
        n += k
        return n
    return inc


@functools.lru_cache(maxsize=None)
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


@functools.lru_cache(maxsize=4)
def coef(k, name="a"):
    return (k + 1.0) / (len(name) + 1.0)


@functools.cache
def table(n):
    return tuple(i * i for i in range(n))


def snapshot():
    return {{"_hits": _hits, "_buf": _buf.getvalue(), "Acc.scale": Acc.scale, "_calls": list(_calls),
            "Base.made": Base.made, "Child.made": Child.__dict__.get("made")}}

'''

# how the body reaches the caller's state, per kind of state
ACCESS = {
    "dict": {"count": 'state["count"]', "log": 'state["log"]', "cache": 'state["cache"]',
             "scale": 'state["scale"]', "buf": 'state["buf"]'},
    "list": {"count": "state[0]", "log": "state[1]", "cache": "state[2]", "scale": "state[3]",
             "buf": "state[4]"},
    "obj": {"count": "state.count", "log": "state.log", "cache": "state.cache",
            "scale": "state.scale", "buf": "state.buf"},
}

RAISERS = [  # (statement that raises when taken, exception it raises, an except clause catching it)
    ('{v} = {d}["nokey"]', "KeyError", ["KeyError", "LookupError", "Exception"]),
    ("{v} = lookup({d}, 'zz')", "KeyError", ["KeyError", "LookupError"]),
    ("{v} = {l}[len({l}) + 3]", "IndexError", ["IndexError", "LookupError"]),
    ("{v} = [][0]", "IndexError", ["IndexError"]),
    ("{v} = {l}.index(-99)", "ValueError", ["ValueError", "Exception"]),
    ('{v} = int("x" + str({i}))', "ValueError", ["ValueError"]),
    ('raise FuzzError("bad %d" % {i})', "FuzzError", ["FuzzError", "Exception"]),
    ("{v} = check({i} + 100, 5)", "FuzzError", ["FuzzError"]),
    ('raise ValueError("value " + str({i}))', "ValueError", ["ValueError", "(KeyError, ValueError)"]),
    ('raise KeyError({i})', "KeyError", ["KeyError", "(KeyError, IndexError)"]),
    ("{v} = {d}.pop('qq')", "KeyError", ["KeyError"]),
    ("{v} = [].pop()", "IndexError", ["IndexError"]),
]


class _Gen:
    def __init__(self, seed: int, rng: random.Random):
        self.seed = seed
        self.rng = rng
        self.lines: list = []
        self.ind = 1
        self.env: dict = {}          # name -> kind (names certainly assigned at this point)
        self.readonly: set = set()   # names a nested function must not assign
        self.frozen: set = set()     # containers being iterated (not to be mutated)
        self.owned: set = set()      # tensors the function made (safe for in-place ops)
        self.n = 0
        self.depth = 0
        self.in_func = False         # inside a nested def
        self.in_loop = False
        self.state_kind = rng.choice(["dict", "dict", "list", "obj"])
        self.acc = ACCESS[self.state_kind]
        self.breaks = rng.random() < 0.35   # graph breaks allowed in this program
        self.uses_global = rng.random() < 0.15
        self.budget = rng.randint(6, 18)    # statements
        self.nograd = 0                     # inside a block where grad mode may be off

    # -- helpers --------------------------------------------------------------------------
    def emit(self, s: str):
        self.lines.append("    " * self.ind + s)

    def new(self, kind: str) -> str:
        self.n += 1
        name = {T: "t", S: "s", I: "n", F: "f", B: "b", STR: "m", L: "l", LT: "ts", D: "d",
                Z: "z", O: "o", "C": "ob", "DC": "dc", "NT": "nt", "Q": "q", "DD": "dd", "OD": "od"}[kind] + str(self.n)
        return name

    def bind(self, name, kind):
        self.env[name] = kind

    def vars(self, kind, writable=False):
        out = [n for n, k in self.env.items() if k == kind]
        if writable:
            out = [n for n in out if n not in self.readonly and n not in self.frozen]
        return out

    def pick(self, kind, writable=False):
        vs = self.vars(kind, writable)
        return self.rng.choice(vs) if vs else None

    def chance(self, p):
        return self.rng.random() < p

    def small(self):
        return self.rng.choice([1, 2, 3, 2, 4])

    # -- expressions ----------------------------------------------------------------------
    def tex(self, d=0) -> str:
        r = self.rng
        base = [n for n in self.vars(T)] + ["x", "y"]
        if d >= 2 or r.random() < 0.3:
            return r.choice(base)
        a = self.tex(d + 1)
        c = r.randrange(16)
        if c == 0:
            return f"({a} + {self.tex(d + 1)})"
        if c == 1:
            return f"({a} - {self.tex(d + 1)})"
        if c == 2:
            return f"({a} * {self.fex(d + 1)})"
        if c == 3:
            return f"({a} * {self.sex(d + 1)})"
        if c == 4:
            return f"torch.{r.choice(['sin', 'tanh', 'relu', 'sigmoid', 'cos'])}({a})"
        if c == 5:
            return f"{a}.clamp(-2.0, 2.0)"
        if c == 6:
            b = self.tex(d + 1)
            return f"torch.where({a} > {b}, {a}, {b})"
        if c == 7:
            return f"({a} * {self.tex(d + 1)})"
        if c == 8:
            return f"({a} / (1.0 + {self.tex(d + 1)}.abs()))"
        if c == 9:
            return f"({a} + {self.iex(d + 1)} % 3)"
        if c == 10:
            return f"{a}.abs()"
        if c == 11:
            return f"({a} + {a}.sum(1, keepdim=True) * 0.1)"
        if c == 12:
            lt = self.pick(LT)
            if lt:
                return f"torch.stack([{a}] + {lt}).mean(0)"
            return f"torch.stack([{a}, {self.tex(d + 1)}]).sum(0)"
        if c == 13:
            return f"torch.maximum({a}, {self.tex(d + 1)})"
        if c == 14:
            o = self.pick(O)
            if o:
                return f"({a} + {o}.t)"
            return f"(-{a})"
        return f"operator.{r.choice(['add', 'sub', 'mul'])}({a}, {self.tex(d + 1)})"

    def sex(self, d=0) -> str:
        r = self.rng
        vs = self.vars(S)
        if vs and (d >= 2 or r.random() < 0.3):
            return r.choice(vs)
        c = r.randrange(8)
        t = self.tex(d + 1)
        if c == 0:
            return f"{t}.sum()"
        if c == 1:
            return f"{t}.mean()"
        if c == 2:
            return f"{t}.amax()"
        if c == 3:
            return f"{t}[0, 0]"
        if c == 4:
            return f"{t}.norm()"
        if c == 5:
            o = self.pick(O)
            return f"{o}.total" if o else f"{t}.min()"
        if c == 6:
            return f"({self.sex(d + 1)} * {self.fex(d + 1)})"
        return f"{t}[-1].sum()"

    def iex(self, d=0) -> str:
        r = self.rng
        vs = self.vars(I)
        if d >= 2 or r.random() < 0.25:
            if vs and r.random() < 0.6:
                return r.choice(vs)
            return str(r.randint(-3, 6))
        c = r.randrange(22)
        if c == 0:
            return f"x.shape[{r.randint(0, 1)}]"
        if c == 1:
            return f"x.size({r.randint(-1, 1)})"
        if c == 2:
            return "x.dim()"
        if c == 3:
            return "y.numel()"
        if c == 4:
            lv = self.pick(L)
            return f"len({lv})" if lv else f"len({self.acc['log']})"
        if c == 5:
            dv = self.pick(D)
            return f"len({dv})" if dv else f"len({self.acc['cache']})"
        if c == 6:
            return f"({self.iex(d + 1)} + {self.iex(d + 1)})"
        if c == 7:
            return f"({self.iex(d + 1)} * {r.randint(-2, 3)})"
        if c == 8:
            return f"({self.iex(d + 1)} % {r.randint(2, 5)})"
        if c == 9:
            return f"({self.iex(d + 1)} // {r.choice([2, 3, -2])})"
        if c == 10:
            return f"{r.choice(['max', 'min'])}({self.iex(d + 1)}, {self.iex(d + 1)})"
        if c == 11:
            lv = self.pick(L)
            return f"sum({lv})" if lv else f"sum({self.acc['log']})"
        if c == 12:
            return self.acc["count"]
        if c == 13:
            return f"int({self.fex(d + 1)})"
        if c == 14:
            return f"math.floor({self.fex(d + 1)})"
        if c == 15:
            lv = self.pick(L)
            if lv:
                return f"functools.reduce(operator.add, {lv}, {r.randint(0, 3)})"
            return f"abs({self.iex(d + 1)})"
        if c == 16:
            lv = self.pick(L) or self.acc["log"]
            return f"len([v for v in {lv} if v % 2 == 0])"
        if c == 17:
            o = self.pick(O)
            return f"{o}.{r.choice(['n', 'count'])}" if o else f"-{self.iex(d + 1)}"
        if c == 18 and self.uses_global:
            return "_hits"
        if c == 19 and self.breaks and self.chance(0.4):
            return f"int({self.tex(d + 1)}.argmax())"
        if c == 20:
            dv = self.pick(D) or self.acc["cache"]
            return f"{dv}.get('{r.choice('abcq')}', {r.randint(0, 3)})"
        lv = self.pick(L)
        if lv:
            return f"({lv}[-1] if {lv} else {r.randint(0, 3)})"
        return f"len({self.acc['log']})"

    def fex(self, d=0) -> str:
        r = self.rng
        vs = self.vars(F)
        if d >= 2 or r.random() < 0.3:
            if vs and r.random() < 0.6:
                return r.choice(vs)
            return repr(r.choice([0.5, 1.5, -0.25, 2.0, 0.1, 3.0]))
        c = r.randrange(13)
        if c == 0:
            return f"float({self.iex(d + 1)})"
        if c == 1:
            return f"({self.fex(d + 1)} * {r.choice([0.5, 2.0, -1.5])})"
        if c == 2:
            return f"({self.fex(d + 1)} + {self.iex(d + 1)})"
        if c == 3:
            return f"math.sqrt(abs({self.fex(d + 1)}) + 1.0)"
        if c == 4:
            return f"math.{r.choice(['cos', 'sin', 'tanh', 'atan'])}({self.fex(d + 1)})"
        if c == 5:
            return f"math.log1p(abs({self.fex(d + 1)}))"
        if c == 6:
            return r.choice(["math.pi", "math.e"])
        if c == 7:
            return f"{r.choice(['max', 'min'])}({self.fex(d + 1)}, {self.fex(d + 1)})"
        if c == 8:
            return self.acc["scale"]
        if c == 9:
            return r.choice(["Acc.scale", f"({self.fex(d + 1)} / (abs({self.fex(d + 1)}) + 1.0))"])
        if c == 10 and self.breaks and self.chance(0.5):
            return f"{self.sex(d + 1)}.item()"
        if c == 11 and self.state_kind == "obj":
            return "state.total"
        return f"round({self.fex(d + 1)}, 2)"

    def bex(self, d=0) -> str:
        r = self.rng
        c = r.randrange(16)
        if c == 0:
            return f"{self.iex(d + 1)} > {self.iex(d + 1)}"
        if c == 1:
            return f"{self.iex(d + 1)} % 2 == 0"
        if c == 2:
            return f"{self.fex(d + 1)} < {r.choice([0.5, 1.0, -0.5])}"
        if c == 3:
            return r.choice(["x.shape[0] == x.shape[1]", f"x.shape[0] > {r.randint(2, 4)}",
                             "x.dim() == 2", f"x.size(1) % 2 == {r.randint(0, 1)}",
                             f"y.numel() > {r.randint(4, 16)}"])
        if c == 4:
            dv = self.pick(D) or self.acc["cache"]
            return f"'{r.choice('abcq')}' in {dv}"
        if c == 5:
            zv = self.pick(Z)
            return f"{self.iex(d + 1)} in {zv}" if zv else f"{self.iex(d + 1)} not in {self.acc['log']}"
        if c == 6:
            lv = self.pick(L) or self.acc["log"]
            return f"len({lv}) > {r.randint(0, 3)}"
        if c == 7:
            bv = self.pick(B)
            return f"not {bv}" if bv else "x.requires_grad"
        if c == 8 and d < 2:
            return f"({self.bex(d + 1)}) {r.choice(['and', 'or'])} ({self.bex(d + 1)})"
        if c == 9 and self.breaks and self.chance(0.5):
            return f"{self.sex(d + 1)}.item() > {r.choice([0.0, 0.5, -1.0])}"
        if c == 10 and self.breaks and self.chance(0.4):
            return f"bool({self.sex(d + 1)} > 0)"
        if c == 11:
            return f"isinstance({self.acc['count']}, int)"
        if c == 12:
            lv = self.pick(L) or self.acc["log"]
            return f"any(v > {r.randint(1, 4)} for v in {lv})"
        if c == 13:
            return r.choice(["torch.is_grad_enabled()", "callable(steps)", f"{self.acc['scale']} > 1.0"])
        bv = self.pick(B)
        return bv if bv else f"{self.iex(d + 1)} >= {self.iex(d + 1)}"

    def lex(self) -> str:
        r = self.rng
        c = r.randrange(13)
        lv = self.pick(L) or f"list({self.acc['log']})"
        if c == 0:
            return f"[{self.iex(1)}, {self.iex(1)}]"
        if c == 1:
            return f"[i * {r.randint(1, 3)} for i in range({r.randint(0, 4)})]"
        if c == 2:
            return f"list(range({r.randint(1, 4)}))"
        if c == 3:
            zv = self.pick(Z)
            return f"sorted({zv})" if zv else f"sorted({lv}, reverse=True)"
        if c == 4:
            return f"[v for v in {lv} if v {r.choice(['>', '<', '!='])} {r.randint(0, 3)}]"
        if c == 5:
            return f"{lv}[1:] + [{self.iex(1)}]"
        if c == 6:
            return f"{lv}[::-1]"
        if c == 7:
            return f"list(itertools.accumulate({lv}))"
        if c == 8:
            l2 = self.pick(L) or "[1, 2]"
            return f"list(itertools.chain({lv}, {l2}))"
        if c == 9:
            l2 = self.pick(L) or "[3, 1, 2]"
            return f"[a * b for a, b in zip({lv}, {l2})]"
        if c == 10:
            dv = self.pick(D) or self.acc["cache"]
            return f"list({dv}.values())"
        if c == 11:
            return f"sorted({lv}, key=lambda v: (v % 3, -v))"
        return f"[len(k) for k in {self.pick(D) or self.acc['cache']}]"

    # -- statements -----------------------------------------------------------------------
    def assign(self, kind, expr):
        name = self.new(kind)
        self.emit(f"{name} = {expr}")
        self.bind(name, kind)
        return name

    def stmt(self):
        r = self.rng
        self.budget -= 1
        choices = [
            (self.s_tensor, 10), (self.s_scalar, 5), (self.s_int, 5), (self.s_float, 4),
            (self.s_list, 4), (self.s_dict, 3), (self.s_set, 2), (self.s_listt, 2),
            (self.s_mutate, 7), (self.s_state, 7), (self.s_update, 6),
            (self.s_if, 5), (self.s_for, 6), (self.s_while, 1), (self.s_try, 4), (self.s_with, 3),
            (self.s_closure, 3), (self.s_lambda, 2), (self.s_obj, 3), (self.s_gen, 2),
            (self.s_partial, 2), (self.s_str, 2), (self.s_break, 3 if self.breaks else 0),
            (self.s_global, 2 if self.uses_global else 0),
            # second round
            (self.s_while2, 2), (self.s_forelse, 1), (self.s_deffn, 2), (self.s_unpack, 2), (self.s_walrus, 2),
            (self.s_fstr, 2), (self.s_strops, 2), (self.s_dictbuild, 2), (self.s_views, 2), (self.s_keyfn, 2),
            (self.s_mutloop, 2), (self.s_listm, 2), (self.s_tuplecmp, 1), (self.s_slice, 2), (self.s_gen2, 2),
            (self.s_cls, 2), (self.s_key, 1), (self.s_dc, 2), (self.s_nt, 2), (self.s_exc2, 2), (self.s_with2, 2),
            (self.s_counter, 1), (self.s_lru, 1), (self.s_inplace, 2), (self.s_pyvals, 2), (self.s_grad, 1),
        ]
        if EXTRA:
            choices += [(self.s_match, 3), (self.s_coll, 3), (self.s_tsplit, 3), (self.s_builtins, 4), (self.s_misc, 3), (self.s_round4, 6)]
        if self.depth >= 2 or self.budget < 0:
            choices = [(fn, w) for fn, w in choices
                       if fn not in (self.s_if, self.s_match, self.s_coll, self.s_for, self.s_while, self.s_try, self.s_with,
                                     self.s_closure, self.s_while2, self.s_exc2, self.s_with2, self.s_walrus)]
        if self.in_func:
            choices = [(fn, w) for fn, w in choices if fn not in (self.s_closure, self.s_global, self.s_counter)]
        fns, ws = zip(*choices)
        r.choices(fns, ws)[0]()

    def body(self, n=None, extra=None):
        """A nested block: statements whose new names do not outlive it."""
        saved = dict(self.env)
        saved_owned = set(self.owned)
        self.ind += 1
        self.depth += 1
        start = len(self.lines)
        if extra:
            for nm, k in extra.items():
                self.bind(nm, k)
        for _ in range(n if n is not None else self.rng.randint(1, 3)):
            self.stmt()
        if len(self.lines) == start:
            self.emit("pass")
        self.depth -= 1
        self.ind -= 1
        self.env = saved
        self.owned = saved_owned & set(saved)

    def s_tensor(self):
        expr = self.tex()
        owned = expr not in self.env
        nm = self.assign(T, expr)
        if owned:
            self.owned.add(nm)

    def s_scalar(self):
        self.assign(S, self.sex())

    def s_int(self):
        self.assign(I, self.iex())

    def s_float(self):
        self.assign(F, self.fex())

    def s_str(self):
        r = self.rng
        c = r.randrange(4)
        if c == 0:
            self.assign(STR, f'"n={{}}".format({self.iex(1)})')
        elif c == 1:
            self.assign(STR, f'"-".join(str(v) for v in {self.pick(L) or self.acc["log"]})')
        elif c == 2:
            self.assign(STR, f"str({self.iex(1)}) + {r.choice(['a', 'bc'])!r}")
        else:
            self.assign(STR, f"{r.choice(['Acc.kind', 'FuzzError.__name__', 'type(state).__name__'])}.upper()")

    def s_list(self):
        self.assign(L, self.lex())

    def s_listt(self):
        r = self.rng
        c = r.randrange(4)
        if c == 0:
            nm = self.assign(LT, f"[{self.tex(1)}, {self.tex(1)}]")
        elif c == 1:
            nm = self.assign(LT, f"[{self.tex(1)} * i for i in range({r.randint(1, 3)})]")
        elif c == 2:
            nm = self.assign(LT, f"list(steps({self.tex(1)}, {r.randint(1, 3)}))")
        else:
            nm = self.assign(LT, f"list(x.unbind(0))[:1] and [{self.tex(1)}]")
        return nm

    def s_dict(self):
        r = self.rng
        c = r.randrange(5)
        if c == 0:
            self.assign(D, f"{{'a': {self.iex(1)}, 'b': {self.iex(1)}}}")
        elif c == 1:
            self.assign(D, f"{{f'k{{i}}': i * i for i in range({r.randint(0, 4)})}}")
        elif c == 2:
            self.assign(D, f"dict(zip(['a', 'b', 'c'], {self.pick(L) or '[1, 2, 3]'}))")
        elif c == 3:
            self.assign(D, f"dict({self.acc['cache']})")
        else:
            dv = self.pick(D) or self.acc["cache"]
            self.assign(D, f"{{k: v + 1 for k, v in {dv}.items() if v {r.choice(['>', '<'])} {r.randint(0, 3)}}}")

    def s_set(self):
        r = self.rng
        lv = self.pick(L) or self.acc["log"]
        c = r.randrange(3)
        if c == 0:
            self.assign(Z, f"{{v % 3 for v in {lv}}}")
        elif c == 1:
            self.assign(Z, f"set({lv}) | {{{r.randint(0, 3)}, {r.randint(0, 3)}}}")
        else:
            zv = self.pick(Z)
            self.assign(Z, f"{zv} & {{0, 1, 2}}" if zv else f"set(range({r.randint(0, 3)}))")

    def s_mutate(self):
        r = self.rng
        lv, dv, zv, ltv = (self.pick(L, True), self.pick(D, True), self.pick(Z, True), self.pick(LT, True))
        # in a nested function the enclosing function's containers may be mutated, not rebound
        outer = [n for n in self.readonly if n not in self.frozen and n not in ("x", "y", "state")]
        rebind = True
        if self.in_func and self.chance(0.6):
            cands = [n for n in outer if self.env.get(n) in (L, D, Z, LT)]
            if cands:
                n = self.rng.choice(cands)
                k = self.env[n]
                lv, dv, zv, ltv = (n if k == L else None, n if k == D else None, n if k == Z else None,
                                   n if k == LT else None)
                rebind = False
        opts = []
        if lv:
            opts += [f"{lv}.append({self.iex(1)})", f"{lv}.extend([{self.iex(1)}, {self.iex(1)}])",
                     f"{lv}.insert(0, {self.iex(1)})",
                     f"if {lv}:\n{{IND}}    {lv}[0] = {self.iex(1)}", f"if {lv}:\n{{IND}}    del {lv}[0]",
                     f"{lv}[1:3] = [{self.iex(1)}, {self.iex(1)}]", f"if {lv}:\n{{IND}}    {lv}.pop()",
                     f"{lv}.sort()", f"{lv}.reverse()", f"del {lv}[::2]"]
            if rebind:
                opts += [f"{lv} += [{self.iex(1)}]"] + ([f"{lv} *= 2"] if self.depth == 0 else [])
        if dv:
            k = r.choice("abcq")
            opts += [f"{dv}['{k}'] = {self.iex(1)}", f"{dv}.pop('{k}', None)",
                     f"if '{k}' in {dv}:\n{{IND}}    del {dv}['{k}']", f"{dv}.update({{'{k}': {self.iex(1)}}})",
                     f"{dv}.setdefault('{k}', {self.iex(1)})", f"{dv}['{k}'] = {dv}.get('{k}', 0) + 1"] + (
                     [f"{dv} |= {{'z': {self.iex(1)}}}"] if rebind else [])
        if zv:
            opts += [f"{zv}.add({self.iex(1)})", f"{zv}.discard({self.iex(1)})"] + (
                [f"{zv} |= {{{self.iex(1)}}}"] if rebind else [])
        if ltv:
            opts += [f"{ltv}.append({self.tex(1)})", f"if {ltv}:\n{{IND}}    {ltv}[-1] = {self.tex(1)}"]
        if not opts:
            return self.s_list()
        s = r.choice(opts)
        self.emit(s.replace("{IND}", "    " * self.ind))

    def s_state(self):
        r = self.rng
        a = self.acc
        frozen_log = a["log"] in self.frozen
        opts = [f"{a['count']} += {self.iex(1)}", f"{a['scale']} = {self.fex(1)}"]
        if a["cache"] not in self.frozen:
            opts += [f"{a['cache']}['{r.choice('abq')}'] = {self.iex(1)}",
                     f"{a['cache']}.pop('{r.choice('abc')}', None)"]
        if not frozen_log:
            opts += [f"{a['log']}.append({self.iex(1)})", f"{a['log']}.extend([{self.iex(1)}])",
                     f"{a['log']}[:] = {a['log']}[-2:]"]
        if self.chance(0.3):
            opts += [f"{a['buf']}.add_({self.tex(1)}.detach() * 0.5)", f"{a['buf']} = {a['buf']} + {self.tex(1)}",
                     f"{a['buf']}.mul_({r.choice([0.5, 2.0])})", f"{a['buf']}[0] = {self.tex(1)}[0].detach()"]
        if self.state_kind == "obj":
            opts += [f"state.bump({self.iex(1)})", f"state.tag = {self.iex(1)}"]
        if self.state_kind == "list":
            opts += [f"state.append({self.iex(1)})"]
        self.emit(r.choice(opts))

    def s_update(self):
        """Assign again to an existing name (loop-carried values)."""
        r = self.rng
        kinds = [k for k in (T, I, F, S, L, STR) if self.vars(k, True)]
        if not kinds:
            return self.s_tensor()
        k = r.choice(kinds)
        v = self.pick(k, True)
        if k == T:
            if v in self.owned and self.chance(0.3):
                self.emit(f"{v} {r.choice(['+=', '-=', '*='])} {self.tex(1)}")
            else:
                self.emit(f"{v} = {v} {r.choice(['+', '-', '*'])} {self.tex(1)}")
        elif k == I:
            self.emit(f"{v} {r.choice(['+=', '-='])} {self.iex(1)}")
        elif k == F:
            self.emit(f"{v} = {v} * 0.5 + {self.fex(1)}")
        elif k == S:
            self.emit(f"{v} = {v} + {self.sex(1)}")
        elif k == STR:
            self.emit(f"{v} += str({self.iex(1)})")
        else:
            self.emit(f"{v} = {v} + [{self.iex(1)}]")

    def s_if(self):
        r = self.rng
        self.emit(f"if {self.bex()}:")
        self.body()
        for _ in range(r.choice([0, 0, 1, 2])):
            self.emit(f"elif {self.bex()}:")
            self.body()
        if self.chance(0.5):
            self.emit("else:")
            self.body()

    def s_for(self):
        r = self.rng
        c = r.randrange(11)
        i = self.new(I)
        extra = {}
        frozen = None
        if c <= 2:
            self.emit(f"for {i} in range({r.choice([str(r.randint(1, 4)), f'min(abs({self.iex(1)}), 3)', 'x.shape[0]'])}):")
            extra[i] = I
        elif c == 3:
            lv = self.pick(L) or self.acc["log"]
            self.emit(f"for {i} in {lv}:")
            extra[i] = I
            frozen = lv
        elif c == 4:
            dv = self.pick(D) or self.acc["cache"]
            k, v = self.new(STR), self.new(I)
            self.emit(f"for {k}, {v} in {dv}.items():")
            extra.update({k: STR, v: I})
            frozen = dv
        elif c == 5:
            lv = self.pick(L) or self.acc["log"]
            v = self.new(I)
            self.emit(f"for {i}, {v} in enumerate({lv}):")
            extra.update({i: I, v: I})
            frozen = lv
        elif c == 6:
            lv = self.pick(L) or "[1, 2, 3]"
            t = self.new(T)
            ltv = self.pick(LT)
            self.emit(f"for {i}, {t} in zip({lv}, {ltv or '[x, y]'}):")
            extra.update({i: I, t: T})
            frozen = ltv
        elif c == 7:
            ltv = self.pick(LT) or "[x, y]"
            t = self.new(T)
            self.emit(f"for {t} in {ltv}:")
            extra[t] = T
            frozen = ltv
        elif c == 8:
            j = self.new(I)
            self.emit(f"for {i}, {j} in itertools.product(range(2), range({r.randint(1, 2)})):")
            extra.update({i: I, j: I})
        elif c == 9:
            t = self.new(T)
            self.emit(f"for {t} in steps({self.tex(1)}, {r.randint(1, 3)}):")
            extra[t] = T
        else:
            dv = self.pick(D) or self.acc["cache"]
            k, v = self.new(STR), self.new(I)
            self.emit(f"for {k}, {v} in pairs({dv}):")
            extra.update({k: STR, v: I})
            frozen = dv
        was_frozen = frozen in self.frozen
        if frozen:
            self.frozen.add(frozen)
        was_loop, self.in_loop = self.in_loop, True
        for nm in extra:
            self.readonly.add(nm)   # do not rebind loop variables
        self.body(extra=extra)
        if self.chance(0.25):
            self.ind += 1
            self.emit(f"if {self.bex(1)}:")
            self.emit(f"    {r.choice(['break', 'continue'])}")
            self.ind -= 1
        self.in_loop = was_loop
        if frozen and not was_frozen:
            self.frozen.discard(frozen)
        if self.chance(0.15):
            self.emit("else:")
            self.body(1)

    def s_while(self):
        w = self.new(I)
        self.emit(f"{w} = 0")
        self.emit(f"while {w} < {self.rng.randint(1, 3)}:")
        self.readonly.add(w)
        self.body()
        self.ind += 1
        self.emit(f"{w} += 1")
        self.ind -= 1

    def raise_site(self, catchable=True):
        r = self.rng
        tmpl, exc, catches = r.choice(RAISERS)
        v = self.new(I)
        s = tmpl.format(v=v, d=self.pick(D) or "{'a': 1}", l=self.pick(L) or "[1, 2]", i=self.iex(1))
        return s, exc, catches

    def s_try(self):
        r = self.rng
        s, exc, catches = self.raise_site()
        self.emit("try:")
        self.ind += 1
        saved = dict(self.env)
        if self.chance(0.5):
            self.depth += 1
            self.stmt()
            self.depth -= 1
        if self.chance(0.6):
            self.emit(f"if {self.bex(1)}:")
            self.emit(f"    {s}")
        else:
            self.emit(s)
        if self.chance(0.4):
            self.depth += 1
            self.stmt()
            self.depth -= 1
        self.ind -= 1
        self.env = dict(saved)
        clause = r.choice(catches)
        e = self.new(STR)
        self.emit(f"except {clause} as {e}:")
        self.ind += 1
        self.emit(f"{e}_s = {r.choice(['str', 'repr'])}({e}) + type({e}).__name__")
        self.ind -= 1
        self.env = dict(saved)
        self.body(1, extra={e + "_s": STR})
        if self.chance(0.3):
            self.emit("else:")
            self.body(1)
        if self.chance(0.3):
            self.emit("finally:")
            self.body(1)

    def s_with(self):
        r = self.rng
        c = r.randrange(6)
        extra = {}
        log = self.acc["log"]
        if c == 0:
            self.emit("with torch.no_grad():")
            self.nograd += 1
        elif c == 1:
            k = self.new(I)
            lg = log if log not in self.frozen else "[]"
            self.emit(f"with tracking({lg}, {r.choice(['a', 'b'])!r}) as {k}:")
            extra[k] = I
        elif c == 2:
            self.emit("with contextlib.suppress(KeyError, IndexError):")
            self.ind += 1
            tmpl = r.choice([x[0] for x in RAISERS if x[1] in ("KeyError", "IndexError")])
            self.emit(tmpl.format(v=self.new(I), d=self.pick(D) or "{}", l=self.pick(L) or "[]", i=self.iex(1)))
            self.ind -= 1
        elif c == 3:
            lg = log if log not in self.frozen else "[]"
            self.emit(f"with Scope({lg}):")
        elif c == 4:
            self.emit("with torch.enable_grad():")
        else:
            self.emit("with torch.no_grad(), tracking([], 'c'):")
            self.nograd += 1
        for nm in extra:
            self.readonly.add(nm)
        self.body(extra=extra)
        if c in (0, 5):
            self.nograd -= 1

    def s_closure(self):
        r = self.rng
        fn = f"g{self.n}"
        self.n += 1
        nl = self.pick(I, True) if self.chance(0.6) else None
        cap_t = self.pick(T)
        p = self.new(T)
        k = self.new(I)
        self.emit(f"def {fn}({p}, {k}={r.randint(1, 3)}):")
        self.ind += 1
        saved_env, saved_ro, saved_owned = dict(self.env), set(self.readonly), set(self.owned)
        was = self.in_func
        self.in_func = True
        self.readonly = set(self.env)  # everything outer is read-only in the nested function
        if nl:
            self.emit(f"nonlocal {nl}")
            self.readonly.discard(nl)
            self.emit(f"{nl} += {k}")
        self.bind(p, T)
        self.bind(k, I)
        self.readonly.add(p)
        self.readonly.add(k)
        self.depth += 1
        for _ in range(r.randint(0, 2)):
            self.stmt()
        self.depth -= 1
        self.emit(f"return {p} * {k} + {cap_t or 'x'}" if r.random() < 0.6 else f"return {self.tex(1)}")
        self.in_func = was
        self.ind -= 1
        self.env, self.readonly, self.owned = saved_env, saved_ro, saved_owned
        # call it
        call = r.randrange(4)
        if call == 0:
            self.assign(T, f"{fn}({self.tex(1)})")
        elif call == 1:
            self.assign(T, f"{fn}({self.tex(1)}, {self.iex(1)} % 4)")
        elif call == 2:
            self.assign(LT, f"[{fn}(t) for t in (x, y)]")
        else:
            self.assign(T, f"functools.reduce(lambda a, b: a + {fn}(b), [x, y], {self.tex(1)})")

    def s_lambda(self):
        r = self.rng
        c = r.randrange(4)
        if c == 0:
            fn = self.new(T).replace("t", "h")
            self.emit(f"{fn} = lambda t, s={self.fex(1)}: t * s + {self.tex(1)}")
            self.assign(T, f"{fn}({self.tex(1)})")
        elif c == 1:
            ltv = self.pick(LT) or "[x, y]"
            self.assign(LT, f"list(map(torch.{r.choice(['tanh', 'sin', 'neg'])}, {ltv}))")
        elif c == 2:
            dv = self.pick(D) or self.acc["cache"]
            self.assign(STR, f"max({dv}, key={dv}.get) if {dv} else 'none'")
        else:
            ltv = self.pick(LT) or "[x, y]"
            self.assign(LT, f"sorted({ltv}, key=lambda t: t.shape[{r.randint(0, 1)}])")

    def s_obj(self):
        r = self.rng
        o = self.pick(O)
        if o is None or self.chance(0.3):
            self.assign(O, f"Acc({self.tex(1)}{', ' + self.iex(1) if self.chance(0.5) else ''})")
            return
        c = r.randrange(6)
        if c == 0:
            self.emit(f"{o}.add({self.tex(1)})")
        elif c == 1:
            self.assign(I, f"{o}.bump({self.iex(1)})")
        elif c == 2:
            self.assign(S, f"{o}.total")
        elif c == 3:
            self.emit(f"{o}.n = {self.iex(1)}")
        elif c == 4:
            self.assign(O, f"{o}.add({self.tex(1)}).add({self.fex(1)})")
        else:
            self.assign(B, f"isinstance({o}, Acc) and {o}.count > {r.randint(0, 3)}")

    def s_gen(self):
        r = self.rng
        c = r.randrange(4)
        if c == 0:
            self.assign(T, f"sum(steps({self.tex(1)}, {r.randint(1, 3)}))")
        elif c == 1:
            lv = self.pick(L) or self.acc["log"]
            self.assign(I, f"sum(v * {r.randint(1, 3)} for v in {lv})")
        elif c == 2:
            dv = self.pick(D) or self.acc["cache"]
            self.assign(L, f"[v for _, v in pairs({dv})]")
        else:
            self.assign(L, f"list(itertools.islice(itertools.count({r.randint(0, 3)}), {r.randint(0, 4)}))")

    def s_partial(self):
        r = self.rng
        p = f"p{self.n}"
        self.n += 1
        if self.chance(0.5):
            self.emit(f"{p} = functools.partial(combine, beta={self.fex(1)})")
            self.assign(T, f"{p}({self.tex(1)}, {self.tex(1)}, alpha={self.fex(1)})")
        else:
            self.emit(f"{p} = functools.partial(operator.{r.choice(['add', 'mul'])}, {self.iex(1)})")
            self.assign(I, f"{p}({self.iex(1)})")

    def s_break(self):
        r = self.rng
        c = r.randrange(5)
        if c == 0:
            self.emit(f"print({r.choice([self.iex(1), repr('here'), 'x.shape'])}, file=_buf)")
        elif c == 1:
            self.emit("torch._dynamo.graph_break()")
        elif c == 2:
            self.assign(L, f"[round(v) for v in {self.tex(1)}[0].tolist()]")
        elif c == 3:
            self.assign(F, f"{self.sex(1)}.item()")
        else:
            self.emit(f"if {self.sex(1)}.item() > 0:")
            self.body(1)

    def s_global(self):
        self.emit(f"_hits += {self.iex(1)}")

    # -- more Python (second round): every statement below only binds fresh names or mutates
    # containers picked as writable, so the invariants above hold ------------------------------
    def _lv(self):
        return self.pick(L) or f"list({self.acc['log']})"

    def _m(self):
        return self.pick(STR) or self.rng.choice(["'a1b2'", "Acc.kind", "'x-y-z'", f"str({self.iex(1)})"])

    def s_while2(self):
        """while with continue/break/else; the counter is bumped first, so it always ends."""
        r = self.rng
        w = self.new(I)
        lim = r.randint(2, 5)
        self.emit(f"{w} = 0")
        self.bind(w, I)
        self.readonly.add(w)
        forever = self.chance(0.3)
        self.emit("while True:" if forever else f"while {w} < {lim}:")
        self.ind += 1
        self.emit(f"{w} += 1")
        if forever:
            self.emit(f"if {w} > {lim}:")
            self.emit("    break")
        if self.chance(0.5):
            self.emit(f"if {w} % {r.randint(2, 3)} == {r.randint(0, 1)}:")
            self.emit("    continue")
        self.ind -= 1
        was_loop, self.in_loop = self.in_loop, True
        self.body()
        self.in_loop = was_loop
        if self.chance(0.5):
            self.ind += 1
            self.emit(f"if {self.bex(1)}:")
            self.emit("    break")
            self.ind -= 1
        if self.chance(0.5):
            self.emit("else:")
            self.body(1)

    def s_forelse(self):
        """for ... else with a search that may break."""
        r = self.rng
        lv = self._lv()
        v, hit = self.new(I), self.new(I)
        self.emit(f"{hit} = -1")
        self.emit(f"for {v} in {lv}:")
        self.emit(f"    if {v} {r.choice(['>', '==', '<'])} {r.randint(0, 4)}:")
        self.emit(f"        {hit} = {v}")
        self.emit("        break")
        self.emit("else:")
        self.emit(f"    {hit} = {r.choice([f'len({lv})', '-2', self.iex(1)])}")
        self.bind(hit, I)

    def s_deffn(self):
        """A nested function with defaults, keyword-only, *args and **kwargs, called in several ways."""
        r = self.rng
        fn = f"h{self.n}"
        self.n += 1
        style = r.randrange(3)
        if style == 0:
            self.emit(f"def {fn}(a, *rest, scale={self.fex(1)}, **kw):")
            self.emit("    out = a * scale")
            self.emit("    for r_ in rest:")
            self.emit("        out = out + r_")
            self.emit("    for k_ in sorted(kw):")
            self.emit("        out = out + kw[k_] * len(k_)")
            self.emit("    return out")
            calls = [f"{fn}({self.tex(1)})", f"{fn}({self.tex(1)}, {self.tex(1)}, scale={self.fex(1)})",
                     f"{fn}(*[{self.tex(1)}, {self.tex(1)}], **{{'bias': {self.iex(1)}}})",
                     f"{fn}({self.tex(1)}, *{self.pick(LT) or '[x, y]'})",
                     f"{fn}({self.tex(1)}, k1={self.iex(1)}, k2={self.fex(1)})",
                     f"{fn}(**{{'a': {self.tex(1)}, 'scale': {self.fex(1)}, 'zz': {self.iex(1)}}})"]
            self.assign(T, r.choice(calls))
        elif style == 1:
            self.emit(f"def {fn}(a, b={self.iex(1)}, /, *, c={r.randint(0, 3)}, d=None):")
            self.emit("    if d is None:")
            self.emit("        d = []")
            self.emit("    d.append(a + b + c)")
            self.emit("    return d")
            calls = [f"{fn}({self.iex(1)})", f"{fn}({self.iex(1)}, {self.iex(1)}, c={self.iex(1)})",
                     f"{fn}({self.iex(1)}, d={self._lv()}[:])",
                     f"{fn}(*({self.iex(1)}, 2), **{{'c': {self.iex(1)}}})"]
            self.assign(L, r.choice(calls))
        else:
            self.emit(f"def {fn}(*args, **kwargs):")
            self.emit("    return len(args), sorted(kwargs.items()), args[-1] if args else None")
            n, kv, last = self.new(I), self.new(L), self.new(T)
            self.emit(f"{n}, {kv}, {last} = {fn}({self.tex(1)}, *[{self.tex(1)}], "
                      f"**{{k_: v_ for k_, v_ in {self.pick(D) or self.acc['cache']}.items()}})")
            self.emit(f"{kv} = [v_ for _, v_ in {kv}]")
            self.bind(n, I)
            self.bind(kv, L)
            self.bind(last, T)

    def s_unpack(self):
        r = self.rng
        c = r.randrange(7)
        lv = self._lv()
        if c == 0:
            a, b = self.new(I), self.new(L)
            self.emit(f"{a}, *{b} = [{self.iex(1)}] + {lv}")
            self.bind(a, I), self.bind(b, L)
        elif c == 1:
            a, b = self.new(I), self.new(L)
            self.emit(f"*{b}, {a} = {lv} + [{self.iex(1)}]")
            self.bind(a, I), self.bind(b, L)
        elif c == 2:
            a, b, c2 = self.new(I), self.new(L), self.new(I)
            self.emit(f"{a}, *{b}, {c2} = ({self.iex(1)}, *{lv}, {self.iex(1)})")
            self.bind(a, I), self.bind(b, L), self.bind(c2, I)
        elif c == 3:
            t, ts = self.new(T), self.new(LT)
            self.emit(f"{t}, *{ts} = [{self.tex(1)}, {self.tex(1)}] + {self.pick(LT) or '[]'}")
            self.bind(t, T), self.bind(ts, LT)
        elif c == 4:
            a, b, f = self.new(I), self.new(I), self.new(F)
            self.emit(f"({a}, {b}), {f} = ({self.iex(1)}, {self.iex(1)}), {self.fex(1)}")
            self.bind(a, I), self.bind(b, I), self.bind(f, F)
        elif c == 5:
            a, b = self.new(I), self.new(I)
            self.emit(f"{a}, *_, {b} = x.shape")
            self.bind(a, I), self.bind(b, I)
        else:
            vs = self.vars(I, True)
            if len(vs) >= 2:
                a, b = r.sample(vs, 2)
                self.emit(f"{a}, {b} = {b}, {a}")
            else:
                a, b = self.new(I), self.new(I)
                self.emit(f"{a}, {b} = divmod({self.iex(1)}, {r.randint(2, 5)})")
                self.bind(a, I), self.bind(b, I)

    def s_walrus(self):
        r = self.rng
        c = r.randrange(4)
        if c == 0:
            n = self.new(I)
            self.emit(f"if ({n} := {self.iex(1)}) {r.choice(['>', '<', '=='])} {r.randint(0, 3)}:")
            self.bind(n, I)
            self.body()
        elif c == 1:
            w = self.new(I)
            self.assign(L, f"[{w} for v_ in {self._lv()} if ({w} := v_ * {r.randint(1, 3)}) "
                           f"{r.choice(['>', '<'])} {r.randint(0, 4)}]")
        elif c == 2:
            s = self.new(S)
            self.assign(T, f"{self.tex(1)} * ({s} := {self.sex(1)})")
            self.bind(s, S)
        else:
            n = self.new(I)
            self.assign(L, f"[({n} := {n} + v_) for v_ in {self._lv()}] if ({n} := {self.iex(1)}) else []")
            self.bind(n, I)

    def s_fstr(self):
        r = self.rng
        opts = [f'f"{{x.shape[0]}}x{{x.shape[1]}}:{{{self.iex(1)}}}"',
                f'f"{{{self.iex(1)}:>4}}|{{{self.fex(1)}:.3f}}|{{{self._lv()}!r}}"',
                f'f"{{tuple({self.tex(1)}.shape)}}-{{{self.tex(1)}.dim()}}"',
                f'f"{{x.dtype}}/{{y.device}}/{{x.requires_grad}}"',
                f'f"{{{self._m()}!s:^9}}{{{self.iex(1)}:03d}}"',
                f'f"{{{self.pick(D) or self.acc["cache"]}}}"',
                f'f"{{{self.acc["count"]}=}}"',
                f'f"{{{self.iex(1)}:+}} {{{self.fex(1)}:e}} {{{self.iex(1)}:x}}"']
        if self.breaks:
            opts += [f'f"{{{self.sex(1)}.item():.2f}}"', f'f"{{{self.tex(1)}.sum().item() > 0}}"',
                     f'f"{{{self.tex(1)}[0].tolist()}}"[:1]']
        e = r.choice(opts)
        last = e.rindex('"')
        # triple quotes: the expressions may hold either quote (Python 3.11)
        self.assign(STR, 'f"""' + e[2:last] + '"""' + e[last + 1:])

    def s_strops(self):
        r = self.rng
        m = self._m()
        c = r.randrange(12)
        if c == 0:
            self.assign(STR, f'"".join(reversed({m}))')
        elif c == 1:
            self.assign(STR, f"{m}[::-1] + {m}[-2:] + {m}[1::2]")
        elif c == 2:
            self.assign(I, f"len({m}.split({r.choice(['x', '-', ':', '1'])!r}))")
        elif c == 3:
            self.assign(STR, f'"-".join(sorted({m}, reverse={r.choice([True, False])}))')
        elif c == 4:
            self.assign(STR, f'"{{:03d}}-{{}}-{{k}}".format({self.iex(1)}, {m}, k={self.fex(1)})')
        elif c == 5:
            self.assign(STR, f'"%s:%d:%.2f" % ({m}, {self.iex(1)}, {self.fex(1)})')
        elif c == 6:
            self.assign(I, f"sum(ord(c_) for c_ in {m}) % {r.randint(3, 9)}")
        elif c == 7:
            self.assign(L, f"[int(c_) for c_ in {m} if c_.isdigit()]")
        elif c == 8:
            self.assign(STR, f"{m}.replace('1', '_').upper().strip('_')")
        elif c == 9:
            self.assign(B, f"{m}.startswith({r.choice(['a', 'c/', '1', 'n'])!r}) or {m}.endswith('2')")
        elif c == 10:
            v = self.new(STR)
            self.emit(f"{v} = ''")
            self.emit(f"for c_ in {m}:")
            self.emit(f"    if c_ in 'aeiou0123':")
            self.emit("        continue")
            self.emit(f"    {v} += c_ * {r.randint(1, 2)}")
            self.bind(v, STR)
        else:
            self.assign(L, f"[len(p_) for p_ in {m}.partition({r.choice(['x', '-', '1'])!r})]")

    def s_dictbuild(self):
        r = self.rng
        dv = self.pick(D) or self.acc["cache"]
        c = r.randrange(5)
        wd = self.pick(D, True)
        if c == 0 or (c in (1, 2) and wd is None):
            d = self.new(D)
            self.emit(f"{d} = {{}}")
            self.emit(f"for k_, v_ in {dv}.items():")
            self.emit(f"    if v_ % 2 == {r.randint(0, 1)}:")
            self.emit(f"        {d}[k_] = v_ * {r.randint(1, 3)}")
            self.emit("    else:")
            self.emit(f"        {d}[k_ + k_] = -v_")
            self.emit(f"    {d}.setdefault('n', 0)")
            self.emit(f"    {d}['n'] += 1")
            self.bind(d, D)
        elif c == 1:
            self.emit(f"for k_ in list({wd}):")
            self.emit(f"    if {wd}[k_] {r.choice(['>', '<'])} {r.randint(0, 3)}:")
            self.emit(f"        del {wd}[k_]")
        elif c == 2:
            self.emit(f"for k_ in {wd}:")
            self.emit(f"    {wd}[k_] += {self.iex(1)}")
        elif c == 3:
            kv = self.new(I)
            d2 = self.pick(D) or "{'a': 0, 'z': 1}"
            self.emit(f"{kv} = {dv}.keys()")  # a live view: later writes show through it
            wd = self.pick(D, True)
            if wd == dv and self.chance(0.7):
                self.emit(f"{wd}[{r.choice(['z', 'a', 'q'])!r}] = {self.iex(1)}")
            op = r.choice(['&', '|', '-', '^'])
            self.emit(f"{kv} = len({kv} {op} {d2}.keys()) + len({kv}) + sum(len(k_) for k_ in {kv})")
            self.bind(kv, I)
        else:
            d = self.new(D)
            self.emit(f"{d} = dict(sorted({dv}.items(), key=lambda kv_: ({r.choice(['-', ''])}kv_[1], kv_[0])))")
            self.bind(d, D)

    def s_views(self):
        r = self.rng
        dv = self.pick(D) or self.acc["cache"]
        d2 = self.pick(D) or "{'a': 5, 'c': 1}"
        c = r.randrange(7)
        if c == 0:
            self.assign(Z, f"set({dv}.values()) {r.choice(['|', '&', '-', '^'])} {self.pick(Z) or '{1, 2}'}")
        elif c == 1:
            self.assign(STR, f"''.join(sorted({dv}.keys() {r.choice(['|', '&', '-', '^'])} {d2}.keys()))")
        elif c == 2:
            self.assign(B, f"{dv}.keys() == {d2}.keys() or {dv}.keys().isdisjoint({d2})")
        elif c == 3:
            self.assign(L, f"list(reversed({dv}.values()))")
        elif c == 4:
            self.assign(I, f"len({dv}.items() & {d2}.items()) + (('a', 1) in {dv}.items())")
        elif c == 5:
            self.assign(STR, f"'/'.join(reversed({dv}))")
        else:
            t = self.new(T)
            self.emit(f"{t} = {self.tex(1)}")
            self.emit(f"for k_, v_ in {dv}.items():")
            self.emit(f"    {t} = {t} + v_ * len(k_)")
            self.bind(t, T)

    def s_keyfn(self):
        r = self.rng
        lv = self._lv()
        dv = self.pick(D) or self.acc["cache"]
        c = r.randrange(12)
        if c == 0:
            self.assign(L, f"sorted({lv}, key=abs)")
        elif c == 1:
            self.assign(L, f"sorted({lv}, key=lambda v_: (-v_ % 3, v_), reverse={r.choice([True, False])})")
        elif c == 2:
            self.assign(I, f"max({lv}, key=lambda v_: v_ % {r.randint(2, 4)}, default=-1)")
        elif c == 3:
            self.assign(STR, f"min({dv}, key={dv}.get, default='none')")
        elif c == 4:
            self.assign(STR, f"max({dv}.items(), key=lambda kv_: (kv_[1], kv_[0]), default=('none', 0))[0]")
        elif c == 5:
            self.assign(T, f"min({self.pick(LT) or '[x, y]'}, key=lambda t_: t_.shape[{r.randint(0, 1)}])")
        elif c == 6 and self.breaks:
            self.assign(LT, f"sorted({self.pick(LT) or '[x, y]'}, key=lambda t_: t_.sum().item())")
        elif c == 7:
            self.assign(I, f"max(range({r.randint(1, 5)}), key=lambda i_: (i_ * 7) % 5)")
        elif c == 8:
            self.assign(B, f"any(v_ % 2 for v_ in {lv}) and all(v_ >= 0 for v_ in {lv})")
        elif c == 9:
            self.assign(B, f"all(t_.shape == x.shape for t_ in {self.pick(LT) or '[x, y]'})")
        elif c == 10:
            self.assign(B, f"any(k_.startswith('a') for k_ in {dv}) or any([]) or not all([])")
        else:
            self.assign(L, f"sorted({dv}, key=len) and [len(k_) for k_ in sorted({dv}, key=lambda k_: (len(k_), k_))]")

    def s_mutloop(self):
        """Loops over lists mutated in their own body (bounded by a length cap)."""
        r = self.rng
        lv = self._lv()
        l = self.new(L)
        self.emit(f"{l} = list({lv}) or [1, 2]")
        c = r.randrange(5)
        cap = r.randint(4, 9)
        if c == 0:
            self.emit(f"for i_, v_ in enumerate({l}):")
            self.emit(f"    if len({l}) < {cap} and v_ % 2 == 0:")
            self.emit(f"        {l}.append(v_ + 1)")
            self.emit(f"    {l}[i_] = v_ * 2")
        elif c == 1:
            # (inserting at the front here is kiln bug "reversed() of a list mutated in the loop":
            # reversed() iterates a snapshot; left out so that other findings show)
            self.emit(f"for v_ in reversed({l}):")
            self.emit(f"    if len({l}) < {cap}:")
            self.emit(f"        {l}.append(v_ - 1)")
        elif c == 2:
            l2 = self.pick(L) or "[3, 1, 2]"
            self.emit(f"for a_, b_ in zip({l}, {l2}):")
            self.emit(f"    if len({l}) < {cap}:")
            self.emit(f"        {l}.append(a_ + b_)")
        elif c == 3:
            self.emit(f"for v_ in {l}:")
            self.emit(f"    if v_ % {r.randint(2, 3)} == 0:")
            self.emit(f"        {l}.remove(v_)")
        else:
            self.emit(f"for i_ in range(len({l})):")
            self.emit(f"    {l}[i_:i_ + 1] = [{l}[i_] + i_]")
            self.emit(f"    {l}.extend([] if len({l}) > {cap} else [i_])")
        self.bind(l, L)

    def s_listm(self):
        r = self.rng
        lv = self.pick(L, True)
        if lv is None:
            lv = self.new(L)
            self.emit(f"{lv} = list({self._lv()})")
            self.bind(lv, L)
        c = r.randrange(9)
        if c == 0:
            self.emit(f"{lv}.sort(key=lambda v_: (v_ % 3, v_), reverse={r.choice([True, False])})")
        elif c == 1:
            self.emit(f"{lv}.reverse()")
        elif c == 2:
            self.emit(f"{lv}.insert({r.choice([-1, 100, -100, 1])}, {self.iex(1)})")
        elif c == 3:
            self.emit(f"{lv}.extend(v_ * 2 for v_ in {lv}[:2])")
        elif c == 4:
            v = self.new(I)
            self.emit(f"{v} = {self.iex(1)}")
            self.emit(f"if {v} in {lv}:")
            self.emit(f"    {lv}.remove({v})")
            self.bind(v, I)
        elif c == 5:
            self.assign(I, f"{lv}.index({lv}[-1]) if {lv} else -1")
        elif c == 6:
            self.assign(I, f"{lv}.count({self.iex(1)}) + {lv}.count(0)")
        elif c == 7:
            self.emit(f"{lv}[::2] = [v_ * -1 for v_ in {lv}[::2]]")
        else:
            self.assign(L, f"{lv}.copy()[::-2] + {lv}[-3:-1] + {lv}[slice(1, None, 2)]")

    def s_tuplecmp(self):
        r = self.rng
        lv = self._lv()
        c = r.randrange(5)
        if c == 0:
            self.assign(B, f"({self.iex(1)}, {self.iex(1)}) < ({self.iex(1)}, {self.iex(1)})")
        elif c == 1:
            self.assign(B, f"tuple({lv}) <= tuple({self.pick(L) or '[1, 2]'})")
        elif c == 2:
            self.assign(B, "(x.shape[0], x.shape[1]) == (y.shape[1], y.shape[0]) or x.shape < (3, 3)")
        elif c == 3:
            self.assign(STR, f"max(({self.iex(1)}, 'a'), ({self.iex(1)}, 'b'))[1]")
        else:
            self.assign(L, f"[a_ for a_, _ in sorted(zip({lv}, range(10)), reverse=True)]")

    def s_slice(self):
        r = self.rng
        t = self.tex(1)
        opts = [f"({t} + {t}[-1:])", f"({t} * {t}[:, -1:])", f"({t} - {t}[::2].sum(0))",
                f"({t} + {t}[1::2].mean(0, keepdim=True))", f"{t}.flip(0)",
                f"({t} + {t}[..., ::2].sum(-1, keepdim=True))",
                f"{t}[torch.arange({t}.shape[0] - 1, -1, -1)]", f"({t} + {t}[[0, -1]].sum(0))",
                f"torch.cat([{t}[1:], {t}[:1]])", f"{t}[:, [{r.randint(-2, 1)}]].expand_as({t})"]
        self.assign(T, r.choice(opts))

    def s_gen2(self):
        r = self.rng
        c = r.randrange(6)
        g = f"g{self.n}_"
        self.n += 1
        if c == 0:
            a, b, f = self.new(F), self.new(F), self.new(I)
            self.emit(f"{g} = averager()")
            self.emit(f"next({g})")
            self.emit(f"{a} = {g}.send({self.fex(1)})")
            self.emit(f"{a} = {g}.send({self.fex(1)})")
            self.emit("try:")
            self.emit(f"    {g}.send(None)")
            self.emit(f"    {b}, {f} = 0.0, 0")
            self.emit("except StopIteration as e_:")
            self.emit(f"    {b}, {f} = e_.value")
            self.bind(a, F), self.bind(b, F), self.bind(f, I)
        elif c == 1:
            t = self.new(T)
            self.emit(f"{g} = tensor_acc({self.tex(1)})")
            self.emit(f"{t} = next({g})")
            self.emit(f"{t} = {g}.send({self.tex(1)})")
            if self.chance(0.5):
                self.emit(f"{g}.close()")
            else:
                self.emit("try:")
                self.emit(f"    {g}.send(None)")
                self.emit("except StopIteration as e_:")
                self.emit(f"    {t} = e_.value + {t}")
            self.bind(t, T)
        elif c == 2:
            self.assign(LT, f"list(relay({self.tex(1)}, {r.randint(0, 3)}))")
        elif c == 3:
            it, a = self.new(I), self.new(I)
            self.emit(f"{it} = iter({self._lv()})")
            self.emit(f"{a} = next({it}, -1)")
            self.assign(L, f"[{a}] + list({it})")
            self.env.pop(it, None)
        elif c == 4:
            m = self.new(STR)
            self.emit(f"{g} = tensor_acc({self.tex(1)})")
            self.emit(f"next({g})")
            self.emit("try:")
            self.emit(f"    {g}.throw(ValueError({self.iex(1)}))")
            self.emit(f"    {m} = 'no'")
            self.emit("except ValueError as e_:")
            self.emit(f"    {m} = repr(e_)")
            self.bind(m, STR)
        else:
            t = self.new(T)
            self.emit(f"{g} = counted({self.tex(1)}, {r.randint(1, 3)})")
            self.emit(f"{t} = sum({g}) if {self.bex(1)} else next({g})")
            self.bind(t, T)

    def s_cls(self):
        r = self.rng
        o = self.pick("C")
        if o is None or self.chance(0.35):
            self.assign("C", r.choice([f"Child({self.tex(1)}, {self.iex(1)}, {self.fex(1)})",
                                       f"Base({self.tex(1)})", f"Child.make({self.tex(1)})",
                                       f"Base.make({self.tex(1)})", f"Child({self.tex(1)}, off={self.fex(1)})"]))
            return
        c = r.randrange(7)
        if c == 0:
            self.emit(f"{o}.w = {self.fex(1)}")
        elif c == 1:
            self.assign(T, f"{o}.value()")
        elif c == 2:
            self.assign(STR, f"{o}.describe() + type({o}).__name__ + {o}.tag")
        elif c == 3:
            self.assign(I, f"{o}.twice({self.iex(1)}) + Base.twice({o}.k)")
        elif c == 4:
            self.emit(f"{o}.k += {self.iex(1)}")
        elif c == 5:
            self.assign(B, f"isinstance({o}, Child) and issubclass(type({o}), Base)")
        else:
            self.assign(F, f"{o}.w + Child.made + Base.made")

    def s_key(self):
        r = self.rng
        kd = f"kd{self.n}_"
        self.n += 1
        self.emit(f"{kd} = {{Key(1, 'a'): {self.iex(1)}, Key({self.iex(1)}, 'b'): {self.tex(1)}}}")
        c = r.randrange(4)
        if c == 0:
            self.assign(I, f"len({kd}) + (Key(1, 'b') in {kd}) + len({{Key(1, 'a'), Key(1, 'a'), Key(2, 'a')}})")
        elif c == 1:
            self.emit(f"{kd}[Key(1, 'a')] = {self.tex(1)}")
            self.assign(T, f"{kd}[Key(1, 'a')] + {kd}.get(Key(99, 'z'), {self.tex(1)})")
        elif c == 2:
            self.assign(L, f"sorted(k_.a for k_ in {kd})")
        else:
            self.assign(B, f"Key(1, 'a') == Key(1, 'a') and Key(1, 'a') != Key(2, 'a')")

    def s_dc(self):
        r = self.rng
        c = r.randrange(7)
        if c == 0:
            cf = self.new("DC")
            self.emit(f"{cf} = Cfg({self.iex(1)}, {self.fex(1)})")
            self.emit(f"{cf}.tags.append({self.iex(1)})")
            self.emit(f"{cf}.scale *= 2")
            self.bind(cf, "DC")
            self.assign(T, f"{self.tex(1)} * {cf}.scale + {cf}.n")
        elif c == 1:
            p = self.new("DC")
            self.emit(f"{p} = Pt({self.iex(1)}, {self.iex(1)})")
            self.bind(p, "DC")
            self.assign(I, f"{p}.norm1() + dataclasses.replace({p}, b={self.iex(1)}).b + ({p} == Pt({p}.a, {p}.b))")
        elif c == 2:
            m = self.new(STR)
            self.emit("try:")
            self.emit(f"    Pt({self.iex(1)}).a = 1")
            self.emit(f"    {m} = 'ok'")
            self.emit("except dataclasses.FrozenInstanceError as e_:")
            self.emit(f"    {m} = type(e_).__name__ + str(isinstance(e_, AttributeError))")
            self.bind(m, STR)
        elif c == 3:
            bx = self.new("DC")
            self.emit(f"{bx} = Box({self.tex(1)}, {self.fex(1)})")
            self.bind(bx, "DC")
            self.assign(T, f"{bx}.t + {bx}.s")
        elif c == 4:
            self.assign(L, f"list(dataclasses.astuple(Pt({self.iex(1)}, {self.iex(1)})))")
        elif c == 5:
            self.assign(STR, f"','.join(f_.name for f_ in dataclasses.fields(Cfg)) + str(Cfg({self.iex(1)}).tags)")
        else:
            self.assign(D, f"{{k_: v_ for k_, v_ in dataclasses.asdict(Pt({self.iex(1)}, {self.iex(1)})).items()}}")

    def s_nt(self):
        r = self.rng
        c = r.randrange(6)
        q = self.pick("NT")
        if q is None or c == 0:
            self.assign("NT", r.choice([f"Pair({self.iex(1)}, {self.iex(1)})", f"Pair({self.iex(1)})",
                                        f"Pair._make([{self.iex(1)}, {self.iex(1)}])"]))
        elif c == 1:
            self.assign("NT", f"{q}._replace(b={self.iex(1)})")
        elif c == 2:
            self.assign(D, f"dict({q}._asdict())")
        elif c == 3:
            a, b = self.new(I), self.new(I)
            self.emit(f"{a}, {b} = {q}")
            self.bind(a, I), self.bind(b, I)
            self.assign(I, f"{q}.a + {q}[1] + len({q}) + {a} * {b}")
        elif c == 4:
            tp = self.new("NT")
            self.emit(f"{tp} = TP({self.tex(1)}, {self.iex(1)})")
            self.bind(tp, "NT")
            self.assign(T, f"{tp}.scaled() + {tp}[0] + {tp}._replace(k=2).scaled()")
        else:
            self.assign(T, f"TP({self.tex(1)}).t * TP._fields.index('k')")

    def s_exc2(self):
        """try/except/else/finally nested, bare re-raise and raise ... from."""
        r = self.rng
        s, exc, catches = self.raise_site()
        lg = self.acc["log"] if self.acc["log"] not in self.frozen else None
        lv = self.pick(L, True) or lg
        m = self.new(STR)
        self.emit(f"{m} = 'none'")
        self.bind(m, STR)
        self.emit("try:")
        self.ind += 1
        self.emit("try:")
        self.ind += 1
        saved = dict(self.env)
        if self.chance(0.4):
            self.depth += 2
            self.stmt()
            self.depth -= 2
        self.emit(f"if {self.bex(1)}:")
        self.emit(f"    {s}")
        self.env = dict(saved)
        self.ind -= 1
        self.emit(f"except {r.choice(catches)}{' as e_' if True else ''}:")
        self.ind += 1
        if lv:
            self.emit(f"{lv}.append(len(type(e_).__name__))")
        wrap = self.chance(0.5)
        self.emit('raise FuzzError("wrapped") from e_' if wrap else "raise")
        self.ind -= 1
        if self.chance(0.5):
            self.emit("else:")
            self.emit(f"    {m} = 'else'")
        self.emit("finally:")
        if lv and self.chance(0.6):
            self.emit(f"    {lv}.append({r.randint(5, 9)})")
        else:
            self.emit(f"    {m} = {m} + 'fin'")
        self.ind -= 1
        outer = "FuzzError" if wrap else r.choice(catches)
        self.emit(f"except {outer} as e2_:")
        self.emit(f"    {m} = type(e2_).__name__ + str(e2_.__cause__ is not None) + str(e2_)")
        if self.chance(0.3):
            fn = f"h{self.n}"
            self.n += 1
            lg2 = lv or "[]"
            self.emit(f"def {fn}(v_):")
            self.emit("    try:")
            self.emit("        if v_ > 2:")
            self.emit("            raise ValueError(v_)")
            self.emit("        return v_ * 2")
            self.emit("    except ValueError:")
            self.emit("        return -1")
            self.emit("    finally:")
            self.emit(f"        {lg2}.append(v_)")
            self.assign(I, f"{fn}({self.iex(1)}) + {fn}({r.randint(0, 5)})")

    def s_with2(self):
        r = self.rng
        c = r.randrange(6)
        lg = self.acc["log"] if self.acc["log"] not in self.frozen else "[]"
        if c == 0:
            self.emit("with torch.no_grad():")
            self.ind += 1
            self.emit("with torch.enable_grad():")
            self.ind -= 1
            self.ind += 1
            self.nograd += 1
            self.body()
            self.nograd -= 1
            self.ind -= 1
        elif c == 1:
            t = self.new(T)
            self.emit("with torch.autocast('cpu', dtype=torch.bfloat16):")
            a, b = self.tex(1), self.tex(1)
            self.emit(f"    {t} = {r.choice([f'({a} @ {b}.t() @ {a})', f'torch.mm(torch.mm({a}, {b}.t()), {b})'])}")
            self.emit(f"    {t} = {t}.float() + {r.choice(['(x @ y.t()).float().sum()', '0.0', f'{self.tex(1)}'])}")
            self.bind(t, T)
        elif c == 2:
            k = self.new(I)
            self.emit(f"with tracking([], 'n') as {k}, Scope({lg}):")
            self.readonly.add(k)
            self.body(extra={k: I})
        elif c == 3:
            tmpl = r.choice([x[0] for x in RAISERS if x[1] in ("KeyError", "IndexError")])
            self.emit(f"with Swallow({lg}):")
            self.ind += 1
            self.depth += 1
            self.stmt()
            self.depth -= 1
            self.emit(f"if {self.bex(1)}:")
            self.emit("    " + tmpl.format(v=self.new(I), d=self.pick(D) or "{}", l=self.pick(L) or "[]", i=self.iex(1)))
            self.ind -= 1
        elif c == 4:
            self.emit(f"with guarded({lg}) as g_:")
            self.emit(f"    if {self.bex(1)}:")
            self.emit(f"        raise ValueError('v' * {r.randint(1, 3)})")
        else:
            self.emit(f"with torch.set_grad_enabled({self.bex(1)}):")
            self.nograd += 1
            self.body()
            self.nograd -= 1

    def s_counter(self):
        r = self.rng
        c = r.randrange(4)
        if c == 0:
            cn = f"c{self.n}_"
            self.n += 1
            self.emit(f"{cn} = make_counter({self.iex(1)})")
            self.emit(f"{cn}()")
            self.assign(I, f"{cn}({self.iex(1)}) + {cn}()")
        elif c == 1:
            self.emit(f"_calls.append({r.choice([self.iex(1), repr(self._m()) if False else self.iex(1)])})")
        elif c == 2 and not self.in_func:
            fn = f"h{self.n}"
            self.n += 1
            self.emit(f"def {fn}(k_):")
            self.emit("    global _hits")
            self.emit("    _hits += k_")
            self.emit("    return _hits")
            self.assign(I, f"{fn}({self.iex(1)})")
        else:
            self.assign(I, f"len(_calls) + sum(_calls[-2:])")

    def s_lru(self):
        r = self.rng
        c = r.randrange(3)
        if c == 0:
            self.assign(I, f"fib(abs({self.iex(1)}) % 15)")
        elif c == 1:
            self.assign(T, f"{self.tex(1)} * coef({self.iex(1)} % 5, {r.choice(['a', 'bb', 'ccc'])!r})")
        else:
            self.assign(L, f"list(table(abs({self.iex(1)}) % 5))")

    def s_inplace(self):
        """In-place updates of the caller's tensors (y, and x where it does not need a gradient)."""
        r = self.rng
        tgt = r.choice(["y", "y", "x"])
        det = r.choice([".detach()", ".detach()", ""])
        opts = [f"{tgt}.add_({self.tex(1)}{det} * {r.choice([0.5, 0.25])})",
                f"{tgt}[0] = {self.tex(1)}[-1]{det}", f"{tgt}[:, -1] = {self.fex(1)}",
                f"{tgt}.index_put_((torch.tensor([0]),), {self.tex(1)}[0].clone())",
                f"{tgt}.index_put_((torch.tensor([0, -1]), torch.tensor([0, 0])), torch.tensor([1.0, 2.0]), accumulate=True)",
                f"{tgt}.clamp_(-1.0, 1.0)", f"{tgt}.mul_({self.fex(1)})",
                f"{tgt}.masked_fill_({tgt} > {r.choice([0.5, 0.0])}, {self.fex(1)})",
                f"{tgt}[{tgt} < 0] = 0.0", f"{tgt}[::2] += 1.0", f"{tgt}.copy_({self.tex(1)}{det})",
                f"{tgt}.t()[0].zero_()"]
        s = r.choice(opts)
        if tgt == "x":
            self.emit("if not x.requires_grad:")
            self.emit("    " + s)
        else:
            self.emit(s)

    def s_pyvals(self):
        r = self.rng
        t = self.tex(1)
        opts = [(I, f"{t}.dim() + {t}.numel() + len({t})"), (I, f"{t}.shape[-1] * {t}.size(-2) + {t}.ndim"),
                (L, f"list({t}.shape) + [{t}.size(0)]"), (B, f"{t}.is_contiguous() and {t}.is_floating_point()"),
                (STR, f"str({t}.dtype) + {t}.device.type"), (L, f"list({t}.stride())"),
                (I, f"{t}.element_size() * len({t}.shape)"), (B, f"{t}.dtype == torch.float32 and {t}.shape == x.shape")]
        if self.breaks:
            opts += [(F, f"{self.sex(1)}.item()"), (L, f"{t}.argmax(1).tolist()"),
                     (L, f"[int(v_ > 0) for v_ in {t}[0].tolist()]"), (I, f"{t}.nonzero().shape[0]"),
                     (I, f"int(torch.count_nonzero({t} > 0))"), (F, f"{t}[0].tolist()[-1] + {t}.numel()")]
        k, e = r.choice(opts)
        self.assign(k, e)

    def s_grad(self):
        """backward() inside the function: on a leaf the function makes, or on x when it needs one."""
        r = self.rng
        if self.nograd:
            return self.s_tensor()
        c = r.randrange(3)
        w, loss = self.new(T), self.new(S)
        if c == 0:
            self.emit(f"{w} = {self.tex(1)}.detach().clone().requires_grad_(True)")
            self.emit(f"{loss} = (torch.{r.choice(['tanh', 'sin', 'sigmoid'])}({w}) * {self.tex(1)}.detach()).sum()")
            self.emit(f"{loss}.backward()")
            self.bind(loss, S)
            self.assign(T, f"{w}.grad * {r.choice([1.0, 2.0])}")
        elif c == 1:
            self.emit(f"{w} = {self.tex(1)}.detach().requires_grad_()")
            self.emit(f"{loss} = ({w} * {w} * {self.fex(1)}).mean()")
            g = self.new(T)
            self.emit(f"{g}, = torch.autograd.grad({loss}, [{w}])")
            self.bind(g, T)
            self.bind(loss, S)
        else:
            g = self.new(T)
            self.emit("if x.requires_grad:")
            self.emit(f"    {loss} = (x * {self.tex(1)}.detach()).sum()")
            self.emit(f"    {loss}.backward(retain_graph={r.choice([True, False])})")
            self.emit(f"{g} = x.grad.clone() if x.grad is not None else torch.zeros_like(x)")
            self.bind(g, T)

    # -- third round (KILN_FUZZ_EXTRA=1) -----------------------------------------------------
    def s_match(self):
        """match statements: literal/sequence/mapping/class/guard patterns; every arm binds."""
        r = self.rng
        v = self.new(I)
        c = r.randrange(4)
        if c == 0:
            self.emit(f"match ({self.iex(1)}, {self.iex(1)}):")
            self.emit(f"    case (0, _) | (_, 0):")
            self.emit(f"        {v} = {r.randint(-3, 3)}")
            self.emit(f"    case (a_, b_) if a_ > b_:")
            self.emit(f"        {v} = a_ - b_")
            self.emit(f"    case (a_, b_):")
            self.emit(f"        {v} = a_ * 2 + b_")
        elif c == 1:
            lv = self._lv()
            self.emit(f"match {lv}:")
            self.emit(f"    case []:")
            self.emit(f"        {v} = -1")
            self.emit(f"    case [a_]:")
            self.emit(f"        {v} = a_")
            self.emit(f"    case [a_, *rest_] if len(rest_) > 1:")
            self.emit(f"        {v} = a_ + len(rest_)")
            self.emit(f"    case [*_, z_]:")
            self.emit(f"        {v} = z_ * 3")
        elif c == 2:
            dv = self.pick(D) or self.acc["cache"]
            self.emit(f"match {dv}:")
            self.emit(f"    case {{'a': int(a_), **rest_}}:")
            self.emit(f"        {v} = a_ + len(rest_)")
            self.emit(f"    case {{'c': c_}}:")
            self.emit(f"        {v} = c_ * 2")
            self.emit(f"    case _:")
            self.emit(f"        {v} = len({dv})")
        else:
            self.emit(f"match Pt({self.iex(1)}, {self.iex(1)}):")
            self.emit(f"    case Pt(a=0):")
            self.emit(f"        {v} = 100")
            self.emit(f"    case Pt(a_, b_) if b_ < 0:")
            self.emit(f"        {v} = a_ - b_")
            self.emit(f"    case Pt() as p_:")
            self.emit(f"        {v} = p_.norm1()")
        self.bind(v, I)

    def s_coll(self):
        """collections: deque (maxlen, rotate, appendleft), Counter, defaultdict, OrderedDict."""
        r = self.rng
        lv = self._lv()
        c = r.randrange(5)
        if c == 0:
            q = self.new("Q")
            self.emit(f"{q} = collections.deque({lv}, maxlen={r.randint(1, 4)})")
            self.emit(f"{q}.appendleft({self.iex(1)})")
            self.emit(f"{q}.rotate({r.randint(-2, 2)})")
            self.assign(L, f"list({q}) + [len({q}), {q}.maxlen]")
        elif c == 1:
            self.assign(L, f"[k_ * 10 + n_ for k_, n_ in collections.Counter({lv} + [v_ % 2 for v_ in {lv}]).most_common({r.randint(1, 3)})]")
        elif c == 2:
            dd = self.new("DD")
            self.emit(f"{dd} = collections.defaultdict(list)")
            self.emit(f"for i_, v_ in enumerate({lv}):")
            self.emit(f"    {dd}['e' if v_ % 2 == 0 else 'o'].append(i_)")
            self.assign(D, f"{{k_: len(v_) for k_, v_ in sorted({dd}.items())}}")
        elif c == 3:
            od = self.new("OD")
            dv = self.pick(D) or self.acc["cache"]
            self.emit(f"{od} = collections.OrderedDict({dv})")
            self.emit(f"{od}['z'] = {self.iex(1)}")
            self.emit(f"{od}.move_to_end('z', last={r.choice([True, False])})")
            self.assign(D, f"dict({od})")
        else:
            q = self.new("Q")
            self.emit(f"{q} = collections.deque()")
            self.emit(f"for v_ in {lv}:")
            self.emit(f"    {q}.append({self.tex(1)} * v_)")
            self.emit(f"    if len({q}) > 2:")
            self.emit(f"        {q}.popleft()")
            self.assign(T, f"sum({q}, {self.tex(1)})")

    def s_tsplit(self):
        """Tensors split into Python lists and back: split/chunk/unbind/iteration/stack."""
        r = self.rng
        t = self.tex(1)
        c = r.randrange(6)
        if c == 0:
            self.assign(LT, f"list(torch.split({t}, 1, dim={r.randint(0, 1)}))")
        elif c == 1:
            self.assign(S, f"sum(r_.sum() * i_ for i_, r_ in enumerate({t}))")
        elif c == 2:
            self.assign(T, f"torch.stack([{t}, {self.tex(1)}]).{r.choice(['sum', 'amax', 'mean'])}(0)")
        elif c == 3:
            self.assign(I, f"len({t}.chunk({r.randint(1, 3)}, dim={r.randint(0, 1)}))")
        elif c == 4:
            self.assign(T, f"torch.cat({t}.unbind({r.randint(0, 1)})[::-1]).reshape({t}.shape)")
        else:
            v = self.new(S)
            self.emit(f"{v} = {t}.new_zeros(())")
            self.emit(f"for a_, b_ in zip({t}, {self.tex(1)}.flip(0)):")
            self.emit(f"    {v} = {v} + (a_ * b_).sum()")
            self.bind(v, S)

    def s_builtins(self):
        r = self.rng
        lv = self._lv()
        opts = [(I, f"divmod({self.iex(1)}, {r.choice([2, 3, -3])})[{r.randint(0, 1)}]"),
                (I, f"pow({self.iex(1)}, 2, {r.randint(2, 7)})"), (I, f"abs({self.iex(1)}).bit_length()"),
                (L, f"list(map(abs, {lv}))"), (L, f"list(filter(None, {lv}))"),
                (L, f"[i_ * v_ for i_, v_ in enumerate({lv}, start={r.randint(1, 3)})]"),
                (L, f"list(range(10)[{r.randint(0, 3)}:{r.randint(4, 8)}:{r.choice([1, 2])}])"),
                (I, f"len(range({self.iex(1)}, 10, {r.choice([2, 3])}))"),
                (L, f"[a_ - b_ for a_, b_ in itertools.pairwise({lv})]"),
                (L, f"[a_ + b_ for a_, b_ in itertools.combinations({lv}[:4], 2)]"),
                (L, f"[k_ + len(list(g_)) for k_, g_ in itertools.groupby(sorted({lv}))]"),
                (L, f"list(itertools.starmap(operator.mul, zip({lv}, range(5))))"),
                (L, f"[a_ if b_ is None else b_ for a_, b_ in itertools.zip_longest({lv}, [7, 8])]"),
                (I, f"next(iter({lv}), {r.randint(-2, 2)})"),
                (I, f"next((v_ for v_ in {lv} if v_ > {r.randint(0, 3)}), -1)"),
                (STR, f"'%s:%d' % ({self._m()}, {self.iex(1)})"), (STR, f"{self._m()}.partition('-')[2].zfill(3)"),
                (B, f"{self._m()}.startswith(('a', 'x')) or {self._m()}.isdigit()"),
                (STR, f"type({self.pick(O) or 'state'}).__name__"),
                (B, f"isinstance({self.tex(1)}, (list, torch.Tensor)) and callable(getattr(x, 'sum', None))"),
                (I, f"getattr({self.pick(O) or 'Acc'}, 'missing', {r.randint(0, 3)}) + hasattr(Acc, 'total')"),
                (F, f"float(sum(({self.fex(1)}, {self.iex(1)}), 0.5))"), (I, f"round({self.fex(1)})")]
        k, e = r.choice(opts)
        self.assign(k, e)

    def s_misc(self):
        """del, assert, contextlib.suppress, ExitStack, exception attributes."""
        r = self.rng
        c = r.randrange(6)
        if c == 0:
            dv = self.pick(D, True)
            if dv is None:
                return self.s_dict()
            self.emit(f"if 'a' in {dv}:")
            self.emit(f"    del {dv}['a']")
        elif c == 1:
            lv = self.pick(L, True)
            if lv is None:
                return self.s_list()
            self.emit(f"del {lv}[:{r.randint(0, 2)}]")
        elif c == 2:
            self.emit(f"assert x.dim() == 2 and {self._lv()} is not None, 'never'")
        elif c == 3:
            v = self.new(I)
            self.emit(f"{v} = {self.iex(1)}")
            self.emit(f"with contextlib.suppress(KeyError, IndexError):")
            self.emit(f"    {v} = {v} + {self.pick(D) or self.acc['cache']}['{r.choice('aq')}']")
            self.bind(v, I)
        elif c == 4:
            v = self.new(STR)
            self.emit(f"try:")
            self.emit(f"    lookup({self.pick(D) or self.acc['cache']}, 'q{r.randint(0, 9)}')")
            self.emit(f"    {v} = 'found'")
            self.emit(f"except (KeyError, IndexError) as e_:")
            self.emit(f"    {v} = type(e_).__name__ + repr(e_.args)")
            self.bind(v, STR)
        elif self.acc["log"] in self.frozen:
            self.s_tsplit()
        else:
            v = self.new(T)
            self.emit(f"with contextlib.ExitStack() as es_:")
            self.emit(f"    es_.enter_context(torch.no_grad())")
            self.emit(f"    es_.callback({self.acc['log']}.append, {r.randint(0, 9)})")
            self.emit(f"    {v} = {self.tex(1)} * {self.fex(1)}")
            self.bind(v, T)

    def s_round4(self):
        """Aliasing, mutable defaults, dict/list edge methods, Python ints feeding tensor shapes."""
        r = self.rng
        c = r.randrange(12)
        lv = self._lv()
        if c == 0:
            fn = self.new(I).replace("n", "h")
            self.emit(f"def {fn}(a_, acc_=[]):")
            self.emit(f"    acc_.append(a_)")
            self.emit(f"    return len(acc_) + sum(acc_)")
            self.assign(I, f"{fn}({self.iex(1)}) + {fn}({self.iex(1)})")
        elif c == 1:
            a = self.new(L)
            self.emit(f"{a} = {self.acc['log']}")
            if self.acc["log"] in self.frozen:
                self.emit(f"{a} = list({a})")
            self.emit(f"{a}.append({self.iex(1)})")
            self.bind(a, L)
            self.readonly.add(a) if self.in_func else None
        elif c == 2:
            dv = self.pick(D, True)
            if dv is None:
                return self.s_dict()
            self.emit(f"{dv} |= {{'z': {self.iex(1)}}}")
            self.emit(f"{dv}.setdefault('a', {self.iex(1)})")
            self.assign(L, f"[len({dv}.popitem()[0]), len({dv})]")
        elif c == 3:
            l2 = self.pick(L, True)
            if l2 is None:
                return self.s_list()
            self.emit(f"{l2}[1:1] = [{self.iex(1)}, {self.iex(1)}]")
            self.emit(f"{l2} += ({self.iex(1)},)")
            self.emit(f"{l2} *= {r.randint(1, 2)}")
        elif c == 4:
            self.assign(B, f"0 <= {self.iex(1)} < {self.iex(1)} != {self.iex(1)}")
        elif c == 5:
            a, b = self.new(I), self.new(L)
            self.emit(f"{a}, (*{b}, _) = {self.iex(1)}, {lv} + [0]")
            self.bind(a, I); self.bind(b, L)
        elif c == 6:
            self.assign(S, f"torch.tensor([{self.iex(1)}, {self.iex(1)}, len({lv})], dtype=torch.float32).sum() + {self.tex(1)}.mean()")
        elif c == 7:
            self.assign(T, f"{self.tex(1)} * {self.tex(1)}[{self.iex(1)} % {self.tex(1)}.shape[0]]")
        elif c == 8:
            self.assign(S, f"{self.tex(1)}[:({self.iex(1)} % x.shape[0]) + 1].sum() + torch.arange(len({lv}) + 1).sum()")
        elif c == 9:
            t = self.new(T)
            self.emit(f"{t} = {self.tex(1)}.clone()")
            v = r.choice([f"{t}.view(-1)[:{r.randint(1, 3)}]", f"{t}.t()[0]", f"{t}[:, ::2]", f"{t}.unsqueeze(0)[0, -1]"])
            self.emit(f"{v}.{r.choice(['add_', 'mul_', 'sub_'])}({self.fex(1)})")
            self.bind(t, T)
            self.owned.add(t)
        elif c == 10:
            self.assign(STR, f'f"""{{{self.fex(1)}:.3f}}|{{{self.iex(1)}:+d}}|{{{self._m()}!r:>8}}"""')
        else:
            self.assign(T, f"{self.tex(1)}.repeat(1, {r.randint(1, 2)})[:, :x.shape[1]] + torch.full_like(x, {self.fex(1)})")

    def ret(self):
        r = self.rng
        names = [n for n in self.env if n not in ("x", "y", "state")]
        picks = r.sample(names, min(len(names), r.randint(1, 4))) if names else []
        if self.chance(0.2):
            picks.append(r.choice(["x", "state", self.acc["log"], self.acc["cache"], self.acc["buf"]]))
        if not picks:
            picks = [self.tex()]

        def nest(items):
            if len(items) <= 1 and self.chance(0.7):
                return items[0] if items else "None"
            c = r.randrange(4)
            if c == 0:
                return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
            if c == 1:
                return "[" + ", ".join(items) + "]"
            if c == 2:
                return "{" + ", ".join(f"'{chr(97 + i)}': {v}" for i, v in enumerate(items)) + "}"
            h = len(items) // 2
            return f"({nest(items[:h])}, {{'rest': {nest(items[h:])}}})"
        self.emit(f"return {nest(picks)}")

    def program(self):
        if self.uses_global:
            self.emit("global _hits")
        self.env = {"x": T, "y": T}
        self.readonly = {"x", "y", "state"}
        while self.budget > 0:
            self.stmt()
        if self.chance(0.08):  # end by raising on purpose
            s, _, _ = self.raise_site()
            self.emit(f"if {self.bex(1)}:")
            self.emit(f"    {s}")
        self.ret()


@dataclass
class Program:
    seed: int
    source: str
    requires_grad: bool
    attempts: int = 1

    def reproducer(self) -> str:
        return (f"# seed {self.seed} (requires_grad={self.requires_grad}); "
                f"x, y, state = make_inputs(0, {self.requires_grad})\n" + self.source)


def _header(seed, rng, state_kind):
    n0, m0 = rng.randint(2, 5), rng.randint(2, 5)
    n2, m2 = rng.randint(2, 5), rng.randint(2, 5)
    if rng.random() < 0.5:
        n2, m2 = m0, n0
    shapes = ((n0, m0), (n0, m0), (n2, m2))
    return HEADER.format(scale=rng.choice([0.5, 1.0, 2.0]), n0=rng.randint(0, 2),
                         op=rng.choice(["+", "*", "-"]), seed=seed, shapes=repr(shapes),
                         state_kind=state_kind)


def _source(seed: int, attempt: int):
    rng = random.Random(seed * 1000 + attempt)
    g = _Gen(seed, rng)
    g.program()
    src = _header(seed, rng, g.state_kind) + "\ndef f(x, y, state):\n" + "\n".join(g.lines) + "\n"
    return src, rng.random() < 0.2


_counter = [0]


def load_module(source: str, tag: str):
    """Writes source to a real file and imports it (inspect/linecache work on it)."""
    d = os.environ.get("KILN_FUZZ_CAPTURE_DIR") or tempfile.mkdtemp(prefix="kiln_fuzz_capture_")
    os.environ["KILN_FUZZ_CAPTURE_DIR"] = d
    _counter[0] += 1
    name = f"kfc_{tag}_{os.getpid()}_{_counter[0]}"
    path = os.path.join(d, name + ".py")
    with open(path, "w") as fh:
        fh.write(source)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _valid(source: str, requires_grad: bool) -> bool:
    """Runs f eagerly as check_program will; False if it raised something not meant."""
    mod = load_module(source, "gen")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kept = None
            for which in range(3):
                x, y, st = mod.make_inputs(which, requires_grad)
                if which == 1:
                    st = kept
                if which == 0:
                    kept = st
                try:
                    mod.f(x, y, st)
                except Exception as e:  # noqa: BLE001
                    if type(e).__name__ not in MEANT:
                        return False
        return True
    except Exception:  # noqa: BLE001
        return False
    finally:
        sys.modules.pop(mod.__name__, None)


def generate(seed: int) -> Program:
    for attempt in range(40):
        src, rg = _source(seed, attempt)
        compile(src, f"<seed {seed}>", "exec")
        if _valid(src, rg):
            return Program(seed, src, rg, attempt + 1)
    raise RuntimeError(f"seed {seed}: no valid program in 40 attempts")


# ---------------------------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------------------------

class Failure:
    def __init__(self, category, detail, call=0):
        self.category, self.detail, self.call = category, detail, call

    def to_json(self):
        return {"category": self.category, "detail": self.detail, "call": self.call}

    @staticmethod
    def from_json(j):
        return Failure(j["category"], j["detail"], j.get("call", 0))


def _tname(x) -> str:
    t = type(x)
    if t.__module__.startswith("kfc_"):
        return "<module>." + t.__qualname__
    return f"{t.__module__}.{t.__qualname__}"


def _short(x, n=160) -> str:
    try:
        s = repr(x)
    except Exception:  # noqa: BLE001
        s = "<unreprable>"
    s = " ".join(s.split())
    return s if len(s) <= n else s[:n] + "..."


def compare(a, e, path, out, exact, ids=None, depth=0):
    """a: kiln's value, e: eager's. Appends (path, message) to out. ids: (kiln_ids, eager_ids)
    maps from id() of the caller's objects to labels, to check results that are those objects."""
    if depth > 20:
        return
    if ids is not None:
        la, le = ids[0].get(id(a)), ids[1].get(id(e))
        if la != le:
            out.append((path, f"kiln's is {la or 'a new object'}, eager's is {le or 'a new object'}"))
            return
    if _tname(a) != _tname(e):
        out.append((path, f"type {_tname(a)} vs eager {_tname(e)}: {_short(a)} vs {_short(e)}"))
        return
    if isinstance(e, torch.Tensor):
        if a.dtype != e.dtype or a.shape != e.shape:
            out.append((path, f"tensor {a.dtype}{tuple(a.shape)} vs eager {e.dtype}{tuple(e.shape)}"))
            return
        if a.requires_grad != e.requires_grad:
            out.append((path, f"requires_grad {a.requires_grad} vs eager {e.requires_grad}"))
        ad, ed = a.detach(), e.detach()
        ok = torch.equal(ad, ed) or (ad.isnan() == ed.isnan()).all() and torch.equal(ad.nan_to_num(0), ed.nan_to_num(0)) \
            if exact else torch.allclose(ad, ed, rtol=1e-4, atol=1e-5, equal_nan=True)
        if not ok:
            diff = (ad.double() - ed.double()).abs().nan_to_num(float("inf")).max().item()
            out.append((path, f"tensor values differ (max abs diff {diff:.3g}): {_short(ad.tolist())} vs eager {_short(ed.tolist())}"))
        return
    if isinstance(e, float):
        if not (a == e or (math.isnan(a) and math.isnan(e))
                or (not exact and math.isclose(a, e, rel_tol=1e-5, abs_tol=1e-6))):
            out.append((path, f"{a!r} vs eager {e!r}"))
        return
    if isinstance(e, (list, tuple)):
        if len(a) != len(e):
            out.append((path, f"length {len(a)} vs eager {len(e)}: {_short(a)} vs {_short(e)}"))
            return
        for i, (x, y) in enumerate(zip(a, e)):
            compare(x, y, f"{path}[{i}]", out, exact, ids, depth + 1)
        return
    if isinstance(e, dict):
        if list(a.keys()) != list(e.keys()):
            out.append((path, f"keys {list(a.keys())} vs eager {list(e.keys())}"))
            return
        for k in e:
            compare(a[k], e[k], f"{path}[{k!r}]", out, exact, ids, depth + 1)
        return
    if isinstance(e, (set, frozenset)):
        if a != e:
            out.append((path, f"{_short(a)} vs eager {_short(e)}"))
        return
    if isinstance(e, (int, str, bool, type(None), bytes)):
        if a != e:
            out.append((path, f"{a!r} vs eager {e!r}"))
        return
    if hasattr(e, "__dict__") and type(e).__module__.startswith("kfc_"):
        compare(dict(vars(a)), dict(vars(e)), path + ".__dict__", out, exact, ids, depth + 1)
        return
    if a != e:
        out.append((path, f"{_short(a)} vs eager {_short(e)}"))


def _ids(objs: dict, acc: dict | None = None, keep: list | None = None) -> dict:
    """id -> label for the caller's objects reachable from objs (label: where it lives). The
    objects are kept alive in `keep`, so that no id is reused by an object made later."""
    acc = {} if acc is None else acc
    keep = [] if keep is None else keep

    def walk(o, label, d=0):
        if d > 6 or isinstance(o, (int, float, str, bool, type(None))) or id(o) in acc:
            return
        acc[id(o)] = label
        keep.append(o)
        if isinstance(o, dict):
            for k, v in o.items():
                walk(v, f"{label}[{k!r}]", d + 1)
        elif isinstance(o, (list, tuple)):
            for i, v in enumerate(o):
                walk(v, f"{label}[{i}]", d + 1)
        elif hasattr(o, "__dict__") and type(o).__module__.startswith("kfc_"):
            for k, v in vars(o).items():
                walk(v, f"{label}.{k}", d + 1)
    for k, v in objs.items():
        walk(v, k)
    return acc


def _exc(e) -> str:
    return f"{_tname(e).replace('builtins.', '')}({str(e)!r})"


def _where(e, source):
    lines = source.splitlines()
    where = ""
    tb = e.__traceback__
    while tb is not None:
        fn = tb.tb_frame.f_code.co_filename
        if os.path.basename(fn).startswith("kfc_") and 1 <= tb.tb_lineno <= len(lines):
            where = f" (at line {tb.tb_lineno}: {lines[tb.tb_lineno - 1].strip()})"
        tb = tb.tb_next
    return where


@dataclass
class Result:
    seed: int
    source: str
    requires_grad: bool = False
    failures: list = field(default_factory=list)
    eager_raised: list = field(default_factory=list)
    ran_eagerly: bool = False
    graph_breaks: int = 0
    fallback_reasons: dict = field(default_factory=dict)
    seconds: float = 0.0
    kiln_graphs: int = -1
    dynamo_graphs: int = -1
    dynamo_breaks: int = -1

    def to_json(self):
        d = dataclasses.asdict(self)
        d["failures"] = [f.to_json() for f in self.failures]
        return d

    @staticmethod
    def from_json(j):
        j = dict(j)
        j["failures"] = [Failure.from_json(f) for f in j["failures"]]
        return Result(**j)


def check_program(prog: Program, exact: bool | None = None, dynamo: bool = False) -> Result:
    import kiln

    if exact is None:
        exact = BACKEND == "eager"
    t0 = time.time()
    res = Result(prog.seed, prog.source, prog.requires_grad)
    me = load_module(prog.source, "eager")
    mk = load_module(prog.source, "kiln")
    compiled = kiln.compile(mk.f, backend=BACKEND)
    st_e = st_k = None
    try:
        for call in range(3):
            xe, ye, se = me.make_inputs(call, prog.requires_grad)
            xk, yk, sk = mk.make_inputs(call, prog.requires_grad)
            if call == 1 and st_e is not None:  # the state the first call left
                se, sk = st_e, st_k
            keep = []
            ids_e = _ids({"x": xe, "y": ye, "state": se}, None, keep)
            ids_k = _ids({"x": xk, "y": yk, "state": sk}, None, keep)
            e_exc = k_exc = exp = act = None
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    exp = me.f(xe, ye, se)
                except Exception as e:  # noqa: BLE001
                    e_exc = e
                before = kiln.stats()
                try:
                    act = compiled(xk, yk, sk)
                except Exception as e:  # noqa: BLE001
                    k_exc = e
                after = kiln.stats()
            res.eager_raised.append(_exc(e_exc) if e_exc else None)
            if after["eager_fallbacks"] - before["eager_fallbacks"] and e_exc is None:
                res.ran_eagerly = True
            res.graph_breaks += after["graph_breaks"] - before["graph_breaks"]
            for k, v in after["fallback_reasons"].items():
                dv = v - before["fallback_reasons"].get(k, 0)
                if dv:
                    res.fallback_reasons[k] = res.fallback_reasons.get(k, 0) + dv
            fails = []
            if e_exc is not None and k_exc is not None:
                if _tname(e_exc) != _tname(k_exc):
                    fails.append(Failure(EXC_TYPE, f"kiln raised {_exc(k_exc)}{_where(k_exc, prog.source)}; "
                                                   f"eager raised {_exc(e_exc)}{_where(e_exc, prog.source)}"))
                elif str(e_exc) != str(k_exc):
                    fails.append(Failure(EXC_MSG, f"kiln: {_exc(k_exc)}; eager: {_exc(e_exc)}"))
            elif k_exc is not None:
                tb = "".join(traceback.format_exception(type(k_exc), k_exc, k_exc.__traceback__)[-3:])
                fails.append(Failure(KILN_RAISED, f"kiln raised {_exc(k_exc)}{_where(k_exc, prog.source)}\n{tb}"))
            elif e_exc is not None:
                fails.append(Failure(EAGER_RAISED, f"eager raised {_exc(e_exc)}{_where(e_exc, prog.source)}; "
                                                   f"kiln returned {_short(act)}"))
            else:
                out = []
                # what the caller can reach after the call (a result stored into the state too)
                _ids({"state (after the call)": se}, ids_e, keep)
                _ids({"state (after the call)": sk}, ids_k, keep)
                compare(act, exp, "result", out, exact, (ids_k, ids_e))
                for p, m in out:
                    cat = IDENTITY if "object" in m and ("kiln's is" in m) else RESULT
                    fails.append(Failure(cat, f"{p}: {m}"))
            out = []
            compare(sk, se, "state", out, exact)
            fails += [Failure(STATE, f"{p}: {m}") for p, m in out]
            out = []
            compare([xk, yk], [xe, ye], "[x, y]", out, exact)
            compare([xk.grad, yk.grad], [xe.grad, ye.grad], "[x.grad, y.grad]", out, exact)
            fails += [Failure(INPUTS, f"{p}: {m}") for p, m in out]
            out = []
            compare(mk.snapshot(), me.snapshot(), "globals", out, exact)
            fails += [Failure(GLOBALS, f"{p}: {m}") for p, m in out]
            seen = set()
            for f in fails:
                if f.category not in seen:
                    seen.add(f.category)
                    f.call = call
                    res.failures.append(f)
            if call == 0:
                st_e, st_k = se, sk
        if dynamo:
            _dynamo_compare(prog, res)
    finally:
        kiln.reset()
        for m in (me, mk):
            sys.modules.pop(m.__name__, None)
    res.seconds = time.time() - t0
    return res


def _dynamo_compare(prog: Program, res: Result):
    """Graph counts: kiln.explain against torch._dynamo.explain on the first input set."""
    import kiln
    import torch._dynamo

    m1 = load_module(prog.source, "dyn")
    m2 = load_module(prog.source, "kexp")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch._dynamo.reset()
            x, y, st = m1.make_inputs(0, prog.requires_grad)
            try:
                ex = torch._dynamo.explain(m1.f)(x, y, st)
                res.dynamo_graphs, res.dynamo_breaks = ex.graph_count, ex.graph_break_count
            except Exception as e:  # noqa: BLE001
                res.dynamo_graphs = -2
                res.fallback_reasons[f"dynamo explain raised {type(e).__name__}"] = 1
            torch._dynamo.reset()
            kiln.reset()
            x, y, st = m2.make_inputs(0, prog.requires_grad)
            try:
                kx = kiln.explain(kiln.compile(m2.f, backend=BACKEND))(x, y, st)
                res.kiln_graphs = kx.graph_count
            except Exception:  # noqa: BLE001
                res.kiln_graphs = -2
        if res.dynamo_graphs >= 0 and res.kiln_graphs >= 0:
            if res.kiln_graphs == 0 and res.dynamo_graphs > 0:
                res.failures.append(Failure(FALLBACK, f"kiln captured no graph, dynamo {res.dynamo_graphs} "
                                                      f"(reasons: {list(res.fallback_reasons)[:3]})"))
            elif res.kiln_graphs > res.dynamo_graphs:
                res.failures.append(Failure(DYNAMO, f"kiln {res.kiln_graphs} graphs, dynamo {res.dynamo_graphs} "
                                                    f"(dynamo breaks {res.dynamo_breaks}; kiln reasons: "
                                                    f"{list(res.fallback_reasons)[:3]})"))
    finally:
        kiln.reset()
        for m in (m1, m2):
            sys.modules.pop(m.__name__, None)


def check_seed(seed: int, dynamo: bool = False) -> Result:
    try:
        prog = generate(seed)
    except Exception:  # noqa: BLE001
        return Result(seed, "<generation failed>", False,
                      [Failure(HARNESS, "generator raised:\n" + traceback.format_exc())])
    try:
        return check_program(prog, dynamo=dynamo)
    except Exception:  # noqa: BLE001
        return Result(seed, prog.source, prog.requires_grad,
                      [Failure(HARNESS, "runner raised:\n" + traceback.format_exc())])


def format_result(res: Result, ignore=(), show_source=True) -> str:
    fails = [f for f in res.failures if f.category not in ignore]
    calls = ("first inputs", "fresh x, y + state left by call 1", "new shapes + fresh state")
    lines = [f"=== seed {res.seed}: " + ", ".join(sorted({f.category for f in fails}))
             + f" (requires_grad={res.requires_grad})"]
    if show_source:
        lines.append(res.source.split("def snapshot():")[-1].split("\n", 3)[-1].rstrip())
    for f in fails:
        lines.append(f"  [{f.category}] (call {f.call + 1}: {calls[f.call]}) {f.detail.rstrip()}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Child processes (a crash or hang ends one child, blamed on its seed)
# ---------------------------------------------------------------------------------------------

def _worker_main(argv):
    import faulthandler
    faulthandler.enable()
    dynamo = "--dynamo" in argv
    seeds = [int(a) for a in argv if not a.startswith("--")]
    warnings.simplefilter("ignore")
    import atexit
    import shutil
    d = tempfile.mkdtemp(prefix="kiln_fuzz_capture_")  # this child's module files, removed at exit
    os.environ["KILN_FUZZ_CAPTURE_DIR"] = d
    atexit.register(shutil.rmtree, d, True)
    import logging
    logging.disable(logging.WARNING)
    out = sys.stdout
    for s in seeds:
        out.write(json.dumps({"start": s}) + "\n")
        out.flush()
        res = check_seed(s, dynamo)
        out.write(json.dumps({"result": res.to_json()}) + "\n")
        out.flush()


def run_batch(seeds, *, dynamo=False, timeout_per_seed=60.0, on_result=None) -> list:
    results = []
    todo = list(seeds)
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env["KILN_FUZZ_BACKEND"] = BACKEND
    env["KILN_SUPPRESS_WARNINGS"] = "1"
    for v in ("KILN_DEBUG", "KILN_LOGS"):
        env.pop(v, None)
    while todo:
        cmd = [sys.executable, os.path.abspath(__file__), "worker"] + (["--dynamo"] if dynamo else []) \
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
                    r = Result.from_json(msg["result"])
                    results.append(r)
                    done.add(r.seed)
                    current[0] = None
                    if on_result:
                        on_result(r)
            rc = proc.wait()
            stop.set()
            th.join()
            err.seek(0)
            stderr = err.read()
        todo = [s for s in todo if s not in done]
        if not todo:
            break
        crashed = current[0] if current[0] is not None else todo[0]
        what = f"timed out after {timeout_per_seed:g} s" if timed_out[0] else (
            f"killed by signal {-rc}" if rc < 0 else f"exited with status {rc}")
        try:
            p = generate(crashed)
            src, rg = p.source, p.requires_grad
        except Exception:  # noqa: BLE001
            src, rg = "<generation failed>", False
        tail = "\n".join(stderr.strip().splitlines()[-20:])
        r = Result(crashed, src, rg, [Failure(CRASH, f"child {what}\n{tail}")])
        results.append(r)
        if on_result:
            on_result(r)
        todo = [s for s in todo if s != crashed]
    return results


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        _worker_main(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "show":
        for a in sys.argv[2:]:
            print(generate(int(a)).reproducer())
    else:
        print("usage: _fuzz_capture.py worker SEED... | show SEED...", file=sys.stderr)
        sys.exit(2)
