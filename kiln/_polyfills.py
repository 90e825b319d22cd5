"""Python models of C library functions that take tensors inside containers and iterators
(itertools, functools.reduce, operator and its getters, builtins.sum/sorted/min/max with keywords, dict(a=x)), as TorchDynamo's
polyfills are: where capture meets one of these with tensor arguments, it inlines the model
instead, so the loop over tensors is traced into the graph rather than breaking it. Each model
does what the C function does, in the same order (a sum adds from `start` left to right, a sort
is stable); nothing here runs outside capture. The C++ interpreter finds a model by the original
function's identity (`_C._register_polyfill`), never by name.
"""
from __future__ import annotations

import builtins
import functools
import itertools
import os
import operator

_MISSING = object()


def chain(*iterables):
    for it in iterables:
        for x in it:
            yield x


def chain_from_iterable(iterables):
    for it in iterables:
        for x in it:
            yield x


def product(*iterables, repeat=1):
    pools = [tuple(p) for p in iterables] * repeat
    result = [()]
    for pool in pools:
        result = [r + (x,) for r in result for x in pool]
    for r in result:
        yield r


def combinations(iterable, r):
    if r < 0:
        raise ValueError("r must be non-negative")
    return _combinations(tuple(iterable), r)


def _combinations(pool, r):
    n = len(pool)
    if r > n:
        return
    indices = list(range(r))
    yield tuple(pool[i] for i in indices)
    while True:
        i = r - 1
        while i >= 0 and indices[i] == i + n - r:
            i -= 1
        if i < 0:
            return
        indices[i] += 1
        for j in range(i + 1, r):
            indices[j] = indices[j - 1] + 1
        yield tuple(pool[i] for i in indices)


def permutations(iterable, r=None):
    pool = tuple(iterable)
    if r is not None and r < 0:
        raise ValueError("r must be non-negative")
    return _permutations(pool, len(pool) if r is None else r)


def _permutations(pool, r):
    for idx in product(range(len(pool)), repeat=r):
        if len(set(idx)) == r:
            yield tuple(pool[i] for i in idx)


def zip_longest(*iterables, fillvalue=None):
    seqs = [list(it) for it in iterables]
    longest = 0
    for s in seqs:
        longest = len(s) if len(s) > longest else longest
    for i in range(longest):
        yield tuple(s[i] if i < len(s) else fillvalue for s in seqs)


def islice(iterable, *args):
    s = slice(*args)
    start, stop, step = s.start, s.stop, s.step
    if start is not None and (not isinstance(start, int) or start < 0) or (stop is not None and (not isinstance(stop, int) or stop < 0)):
        what = "Stop argument for islice()" if len(args) == 1 else "Indices for islice()"
        raise ValueError(f"{what} must be None or an integer: 0 <= x <= sys.maxsize.")
    if step is not None and (not isinstance(step, int) or step < 1):
        raise ValueError("Step for islice() must be a positive integer or None.")
    return _islice(iter(iterable), start or 0, stop, step or 1)


def _islice(it, start, stop, step):
    # as CPython's: items up to the next index taken, never one past the stop
    count, nxt = 0, start if stop is None else min(start, stop)
    while True:
        while count < nxt:
            try:
                next(it)
            except StopIteration:
                return
            count += 1
        if stop is not None and count >= stop:
            return
        try:
            item = next(it)
        except StopIteration:
            return
        count += 1
        nxt = nxt + step if stop is None else min(nxt + step, stop)
        yield item


def accumulate(iterable, func=None, *, initial=None):
    it = iter(iterable)
    total = initial
    if initial is None:
        for first in it:
            total = first
            break
        else:
            return
    yield total
    for x in it:
        total = total + x if func is None else func(total, x)
        yield total


def repeat(obj, times=None):
    if times is None:
        raise TypeError("kiln: itertools.repeat without `times` is endless")
    for _ in range(times):
        yield obj


def reduce(function, iterable, initial=_MISSING):
    it = iter(iterable)
    if initial is _MISSING:
        for value in it:
            break
        else:
            raise TypeError("reduce() of empty iterable with no initial value")
    else:
        value = initial
    for x in it:
        value = function(value, x)
    return value


def sum_(iterable, /, start=0):
    if isinstance(start, (str, bytes, bytearray)):
        kind = "strings [use ''.join(seq) instead]" if isinstance(start, str) else "bytes [use b''.join(seq) instead]" if isinstance(start, bytes) else "bytearray [use b''.join(seq) instead]"
        raise TypeError(f"sum() can't sum {kind}")
    total = start
    for x in iterable:
        total = total + x
    return total


def sorted_(iterable, /, *, key=None, reverse=False):
    items = list(iterable)
    keys = [key(v) for v in items] if key is not None else list(items)
    order = list(range(len(items)))
    for i in range(1, len(order)):  # insertion sort: stable, as sorted is
        j = i
        while j > 0 and (keys[order[j]] > keys[order[j - 1]] if reverse else keys[order[j]] < keys[order[j - 1]]):
            order[j], order[j - 1] = order[j - 1], order[j]
            j -= 1
    return [items[k] for k in order]


def _extreme(name, better, args, key, default):
    if len(args) == 1:
        items = list(args[0])
        if not items:
            if default is not _MISSING:
                return default
            raise ValueError(f"{name}() iterable argument is empty")
    elif not args:
        raise TypeError(f"{name} expected at least 1 argument, got 0")
    else:
        if default is not _MISSING:
            raise TypeError(f"Cannot specify a default for {name}() with multiple positional arguments")
        items = list(args)
    best = items[0]
    best_key = best if key is None else key(best)
    for item in items[1:]:  # the first of equal items wins, as in CPython
        k = item if key is None else key(item)
        if better(k, best_key):
            best, best_key = item, k
    return best


def max_(*args, key=None, default=_MISSING):
    return _extreme("max", lambda a, b: a > b, args, key, default)


def min_(*args, key=None, default=_MISSING):
    return _extreme("min", lambda a, b: a < b, args, key, default)


def fromkeys(iterable, value=None):
    d = {}
    for k in iterable:
        d[k] = value
    return d


def dict_(*args, **kwargs):
    d = {}
    if args:
        source = args[0]
        if isinstance(source, dict):
            for k in source.keys():
                d[k] = source[k]
        else:
            for k, v in source:
                d[k] = v
    for k in kwargs:
        d[k] = kwargs[k]
    return d


class _Partial:
    # functools.partial over tensors, modules, bound methods or other closures made in the
    # function (a partial of constants is built for real): an object with partial's fields
    # (func, args, keywords: what hasattr and code reading them see) and calling rule, the
    # call's keywords overriding the partial's
    def __init__(self, func, args, keywords):
        self.func = func
        self.args = args
        self.keywords = keywords

    def __call__(self, *more, **more_keywords):
        return self.func(*self.args, *more, **{**self.keywords, **more_keywords})


def partial(func, /, *args, **keywords):
    return _Partial(func, args, keywords)


def itemgetter(*items):
    # operator.itemgetter(0) as a key for sorted/min/max over items holding tensors
    if len(items) == 1:
        item = items[0]
        return lambda obj: obj[item]
    return lambda obj: tuple(obj[i] for i in items)


def attrgetter(*names):
    def get(obj, name):
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj
    if len(names) == 1:
        name = names[0]
        return lambda obj: get(obj, name)
    return lambda obj: tuple(get(obj, n) for n in names)


# The operator module's functions, as the operators they name.
_OPERATORS = {
    operator.add: lambda a, b: a + b, operator.sub: lambda a, b: a - b, operator.mul: lambda a, b: a * b,
    operator.truediv: lambda a, b: a / b, operator.floordiv: lambda a, b: a // b, operator.mod: lambda a, b: a % b,
    operator.pow: lambda a, b: a ** b, operator.matmul: lambda a, b: a @ b, operator.and_: lambda a, b: a & b,
    operator.or_: lambda a, b: a | b, operator.xor: lambda a, b: a ^ b, operator.lt: lambda a, b: a < b,
    operator.le: lambda a, b: a <= b, operator.eq: lambda a, b: a == b, operator.ne: lambda a, b: a != b,
    operator.ge: lambda a, b: a >= b, operator.gt: lambda a, b: a > b, operator.getitem: lambda a, b: a[b],
    operator.neg: lambda a: -a, operator.pos: lambda a: +a, operator.abs: lambda a: abs(a),
    operator.invert: lambda a: ~a, operator.contains: lambda a, b: b in a, operator.concat: lambda a, b: a + b,
}
# ... and those capture runs on any arguments (Python values too: operator.index(3) at capture)
_OPERATORS_ALWAYS = {
    operator.not_: lambda a: not a, operator.truth: lambda a: True if a else False,
    operator.is_: lambda a, b: a is b, operator.is_not: lambda a, b: a is not b,
    operator.index: lambda a: a if type(a) is int else a.__index__(),
    operator.length_hint: lambda obj, default=0: len(obj),
}


class _FunctionCtx:
    """The ctx an autograd.Function's forward is handed where no gradient is wanted (inference):
    what it saves is kept, and nothing else is recorded."""

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    def mark_non_differentiable(self, *args):
        pass

    def mark_dirty(self, *args):
        pass

    def set_materialize_grads(self, value):
        pass


def function_apply(cls, *args, **kwargs):
    """torch.autograd.Function.apply where no input needs a gradient: the forward alone."""
    if cls.setup_context is not _function_setup_context:  # the forward takes no ctx
        return cls.forward(*args, **kwargs)
    return cls.forward(_FunctionCtx(), *args, **kwargs)


class _GradFunctionCtx(_FunctionCtx):
    """The ctx of an autograd.Function whose gradient kiln captures: what the forward saves
    reaches the backward, captured after it. What changes autograd's own record of the outputs
    ends the capture of the call (it then runs for real)."""

    def __init__(self, needs_input_grad):
        self.needs_input_grad = needs_input_grad
        self.saved_tensors = ()
        self.materialize_grads = True

    def mark_non_differentiable(self, *args):
        raise NotImplementedError("kiln: autograd.Function with mark_non_differentiable and a gradient is not captured yet")

    def mark_dirty(self, *args):
        raise NotImplementedError("kiln: autograd.Function that changes its inputs in place (mark_dirty) with a gradient is not captured yet")

    def set_materialize_grads(self, value):
        self.materialize_grads = value


def function_forward(cls, needs_input_grad, *args):
    """Function.apply's forward where a gradient is wanted (kiln captures it under no_grad, as
    autograd runs it), and the ctx the backward reads."""
    ctx = _GradFunctionCtx(needs_input_grad)
    if cls.setup_context is not _function_setup_context:  # forward without ctx, then setup_context
        out = cls.forward(*args)
        cls.setup_context(ctx, args, out)
        return out, ctx
    return cls.forward(ctx, *args), ctx


def function_backward(cls, ctx, *grads):
    """The Function's backward, captured as the template of its gradient."""
    return cls.backward(ctx, *grads)


def _function_setup_context(ctx, inputs, output):  # replaced by torch's in register()
    raise NotImplementedError


def register(register_polyfill) -> None:
    models = {
        itertools.chain: chain, itertools.product: product, itertools.combinations: combinations,
        itertools.chain.from_iterable: chain_from_iterable,
        itertools.permutations: permutations, itertools.zip_longest: zip_longest, itertools.islice: islice,
        itertools.accumulate: accumulate, itertools.repeat: repeat, functools.reduce: reduce,
        builtins.sum: sum_, builtins.sorted: sorted_, builtins.dict: dict_, builtins.max: max_, builtins.min: min_,
    }
    models.update(_OPERATORS)
    for original, model in models.items():
        register_polyfill(original, model)
    # a dict whose values are assigned tensors later: a dict capture tracks, at every call
    register_polyfill(dict.fromkeys, fromkeys, always=True)
    # getters made in the function (a sort key): closures capture can call
    register_polyfill(operator.itemgetter, itemgetter, always=True)
    register_polyfill(operator.attrgetter, attrgetter, always=True)
    register_polyfill(functools.partial, partial, always=True)
    for original, model in _OPERATORS_ALWAYS.items():
        register_polyfill(original, model, always=True)
    # itertools over Python values too: the real call hands back an iterator object capture
    # cannot walk (`for a, b in itertools.product((1, 2), (3,))` broke twice)
    for original in (itertools.chain, itertools.chain.from_iterable, itertools.product, itertools.combinations,
                     itertools.permutations, itertools.zip_longest, itertools.islice, itertools.accumulate,
                     itertools.repeat,  # tuple(repeat(v, 2)): torch's _pair
                     functools.reduce):  # reduce(max, (len(s) for s in shapes)) in torch._refs
        register_polyfill(original, models[original], always=True)
    register_polyfill(os.fspath, lambda path: path if isinstance(path, (str, bytes)) else path.__fspath__(), always=True)
    global _function_setup_context
    import torch
    _function_setup_context = torch.autograd.Function.setup_context
