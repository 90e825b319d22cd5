"""Gradients of torch's operators as PyTorch's OpInfo database exercises them, under kiln.

Cases come from ``torch.testing._internal.common_methods_invocations.op_db``: every OpInfo that
supports autograd and float64 on the CPU (random ops, sparse ops and complex-only ops left out).
For each op, in float64 on the CPU, the first ``MAX_SAMPLES`` sample inputs of
``op.sample_inputs('cpu', torch.float64, requires_grad=True)`` (skipping huge ones) are run

* eagerly and through a fresh ``kiln.compile`` of ``lambda *a, **k: op(*a, **k)`` (through the
  op's ``gradcheck_wrapper`` where it has one, as torch's own gradient tests do), each side on
  its own clone of the sample (tensors made leaves with the sample's requires_grad, strides
  kept). kiln runs functions whose ``__module__`` is torch's as opaque calls, so the lambdas
  torch's test suite defines (``op=lambda x: x.mT``) and its gradcheck wrappers are handed to
  kiln as copies that live in this module (see ``_user``);
* the forward results must agree: structure, shapes, dtypes, values (float64 within
  rtol=1e-7 / atol=1e-9) and every output's ``requires_grad``;
* a fixed random weighted sum of every floating output that requires grad (after the sample's
  ``output_process_fn_grad``) is differentiated with ``torch.autograd.grad`` with respect to
  every input tensor that requires grad (``allow_unused=True``): the gradients must agree, None
  where eager's is None; where eager's backward raises, kiln's must raise the same type.

Each op runs three variants, each with its own fresh compiled function: ``static`` (the samples
as they are), ``noncontiguous`` (``sample.noncontiguous()``) and ``dynamic``
(``kiln.compile(..., dynamic=True)``); ``repeat`` and ``last_grad_only`` can be picked with
``KILN_OPINFO_GRAD_VARIANTS``. Ops whose eager output changes with the seed are skipped. One pytest item per op; known
failures are in XFAIL (strict) keyed by op name (``name.variant`` for variants), each with its
cause. ``KILN_OPINFO_GRAD_LOG=path`` appends one JSON line per op (outcome, and whether kiln
built a backward graph or ran eagerly) for the report.
"""
from __future__ import annotations

import functools
import json
import os
import signal
import types

import pytest
import torch
from torch.utils import _pytree as pytree

import kiln

try:  # torch's test-only module: needs expecttest and the test dependencies of this torch
    from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402
except Exception as e:  # noqa: BLE001
    pytest.skip(f"torch.testing._internal.common_methods_invocations does not import here: {e!r}",
                allow_module_level=True)
# torch's test utilities forbid setting torch.backends flags outside their context managers
torch.backends.flags_frozen.__globals__["__allow_nonbracketed_mutation_flag"] = True
from torch.testing._internal.opinfo.core import OpInfo  # noqa: E402

_DEFAULT_WRAPPER = OpInfo.__dataclass_fields__["gradcheck_wrapper"].default

pytestmark = [pytest.mark.usefixtures("quiet_fallbacks"),
              pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture(autouse=True)
def _backend_flags_settable():
    yield
    torch.backends.flags_frozen.__globals__["__allow_nonbracketed_mutation_flag"] = True


MAX_SAMPLES = int(os.environ.get("KILN_OPINFO_GRAD_MAX_SAMPLES", 4))
MAX_NUMEL = int(os.environ.get("KILN_OPINFO_GRAD_MAX_NUMEL", 4000))  # elements over a sample's tensors
TIMEOUT_S = int(os.environ.get("KILN_OPINFO_GRAD_TIMEOUT", 60))       # per op
TOL = dict(rtol=1e-7, atol=1e-9)
D = torch.float64

# random / nondeterministic ops (also caught at run time by comparing two seeds)
_RANDOM_WORDS = ("dropout", "bernoulli", "normal", "multinomial", "rrelu", "uniform", "rand",
                 "exponential", "cauchy", "geometric", "log_normal", "poisson", "fractional_max_pool")
# ops whose samples are huge or slow (seconds eagerly) on this machine
_SLOW = {"nn.functional.conv_transpose3d", "nn.functional.max_pool3d", "nn.functional.avg_pool3d",
         "nn.functional.max_unpool3d", "nn.functional.interpolate.trilinear", "nn.functional.grid_sample",
         "nn.functional.multi_head_attention_forward", "svd_lowrank", "pca_lowrank", "lobpcg",
         "linalg.lstsq.grad_oriented", "nn.functional.ctc_loss", "cdist"}


def _key(op):
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def _eligible(op):
    name = _key(op)
    if not op.supports_autograd or D not in op.supported_dtypes("cpu"):
        return False
    if "sparse" in name or any(w in name for w in _RANDOM_WORDS) or name in _SLOW:
        return False
    return True


OPS = {}
for _op in op_db:
    if _eligible(_op):
        OPS.setdefault(_key(_op), _op)  # (a few names repeat: the first is kept)


# ---------------------------------------------------------------------------------------------
# Known failures: op key -> cause (the repro in the report names it)
XFAIL: dict[str, str] = {}

# ---------------------------------------------------------------------------------------------
# helpers


def _clone(x):
    """A fresh copy of a sample's arguments: tensors as leaves with their requires_grad and
    strides (dense layouts) kept."""
    def one(t):
        if isinstance(t, torch.Tensor):
            c = None
            if t.layout == torch.strided and t.numel() > 0 and not t.is_contiguous():
                span = 1 + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()))
                base = torch.zeros(span + t.storage_offset(), dtype=t.dtype)
                try:
                    with torch.no_grad():
                        c = base.as_strided(t.shape, t.stride(), t.storage_offset()).copy_(t)
                except RuntimeError:  # overlapping (expanded) layouts
                    c = None
            if c is None:
                c = t.detach().clone(memory_format=torch.preserve_format)
            return c.requires_grad_(t.requires_grad)
        return t
    return pytree.tree_map(one, x)


def _tensors(x):
    return [t for t in pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def _numel(sample):
    return sum(t.numel() for t in _tensors((sample.input, sample.args, sample.kwargs)))


def assert_same(actual, expected, *, path, values=True):
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: kiln gave {type(actual).__name__}, eager a Tensor"
        assert actual.shape == expected.shape, f"{path}: shape {tuple(actual.shape)} != eager {tuple(expected.shape)}"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != eager {expected.dtype}"
        assert actual.requires_grad == expected.requires_grad, (
            f"{path}: requires_grad {actual.requires_grad} != eager {expected.requires_grad}")
        if values:
            t = TOL if (expected.is_floating_point() or expected.is_complex()) else dict(rtol=0, atol=0)
            torch.testing.assert_close(actual.detach(), expected.detach(), equal_nan=True, **t,
                                       msg=lambda m: f"{path}: {m}")
    elif isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)) and type(actual) is type(expected), (
            f"{path}: {type(actual).__name__} != eager {type(expected).__name__}")
        assert len(actual) == len(expected), f"{path}: {len(actual)} items != eager {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, path=f"{path}[{i}]", values=values)
    elif isinstance(expected, dict):
        assert type(actual) is type(expected) and list(actual) == list(expected), f"{path}: keys differ"
        for k in expected:
            assert_same(actual[k], expected[k], path=f"{path}[{k!r}]", values=values)
    elif isinstance(expected, float):
        assert isinstance(actual, float), f"{path}: kiln gave {actual!r}, eager {expected!r}"
        torch.testing.assert_close(actual, expected, equal_nan=True, **TOL, msg=lambda m: f"{path}: {m}")
    else:
        assert type(actual) is type(expected) and actual == expected, f"{path}: {actual!r} != eager {expected!r}"


def _weights(out):
    """Fixed random weights, one per floating output that requires grad (eager's outputs)."""
    g = torch.Generator().manual_seed(7)
    return [torch.randn(t.shape, generator=g, dtype=t.dtype) if (t.is_floating_point() and t.requires_grad)
            else None for t in _tensors(out)]


def _weighted_sum(out, weights):
    total = None
    for t, w in zip(_tensors(out), weights):
        if w is not None and t.requires_grad:
            term = (t * w).sum()
            total = term if total is None else total + term
    return total


def _call(fn, sample_args, seed=0):
    inp, args, kwargs = sample_args
    torch.manual_seed(seed)
    return fn(inp, *args, **kwargs)


def _is_random(op, sample):
    outs = []
    for seed in (11, 12):
        with torch.no_grad():
            outs.append(_call(_eager_fn(op), _clone((sample.input, sample.args, sample.kwargs)), seed))
    try:
        assert_same(outs[0], outs[1], path="o")
        return False
    except AssertionError:
        return True


def _user(f):
    """f as user code: kiln runs functions whose ``__module__`` is torch's as opaque torch calls
    (eagerly, with torch's own backward), which would hide the op from kiln; the lambdas and
    wrappers torch's test suite defines get a copy in this module instead, which kiln inlines."""
    if isinstance(f, functools.partial):
        return functools.partial(_user(f.func), *f.args, **f.keywords)
    if isinstance(f, types.FunctionType) and (f.__module__ or "").startswith("torch.testing"):
        g = types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__, f.__closure__)
        g.__kwdefaults__ = f.__kwdefaults__
        g.__module__ = __name__
        g.__qualname__ = f.__qualname__
        return g
    return f


def _eager_fn(op, user=False):
    wrapper, f = op.gradcheck_wrapper, op.op
    if wrapper.__code__ is _DEFAULT_WRAPPER.__code__:
        wrapper = None
    if user:
        f = _user(f)
        wrapper = wrapper and _user(wrapper)
    if wrapper is None:
        return f

    def fn(*a, **k):
        return wrapper(f, *a, **k)
    return fn


def _grads(out, sample, weights, leaves):
    """(gradients or the exception eager/kiln raised) of the weighted sum w.r.t. leaves."""
    proc = sample.output_process_fn_grad(out)
    loss = _weighted_sum(proc, weights)
    if loss is None or not leaves:
        return None
    try:
        return torch.autograd.grad(loss, leaves, allow_unused=True)
    except Exception as e:  # noqa: BLE001
        return e


def check_sample(op, sample, cf):
    """None when kiln agrees with eager on this sample, else the difference."""
    base = (sample.input, sample.args, sample.kwargs)
    mine, theirs = _clone(base), _clone(base)
    try:
        ref = _call(_eager_fn(op), theirs)
    except Exception:  # noqa: BLE001  (a sample eager rejects: not ours to judge)
        return None
    try:
        got = _call(cf, mine)
    except Exception as e:  # noqa: BLE001
        return f"kiln raised {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    try:
        assert_same(got, ref, path="out")
    except AssertionError as e:
        return f"forward: {str(e)[:600]}"
    ref_leaves = [t for t in _tensors(theirs) if t.requires_grad]
    my_leaves = [t for t in _tensors(mine) if t.requires_grad]
    weights = _weights(sample.output_process_fn_grad(ref))
    gr = _grads(ref, sample, weights, ref_leaves)
    try:
        gm = _grads(got, sample, weights, my_leaves)
    except Exception as e:  # noqa: BLE001  (output_process_fn_grad on kiln's result)
        return f"kiln's output: {type(e).__name__}: {e}"
    if isinstance(gr, Exception):
        if not isinstance(gm, Exception):
            return f"eager's backward raised {type(gr).__name__}, kiln's did not"
        if type(gm) is not type(gr) and not isinstance(gm, type(gr)):
            return f"backward raised {type(gm).__name__} != eager {type(gr).__name__}"
        return None
    if isinstance(gm, Exception):
        return f"kiln's backward raised {type(gm).__name__}: {str(gm).splitlines()[0][:300] if str(gm) else ''}"
    if gr is None or gm is None:
        return None if gr is gm else f"loss: kiln {gm is not None}, eager {gr is not None}"
    for i, (a, e) in enumerate(zip(gm, gr)):
        if (a is None) != (e is None):
            return f"grad[{i}]: kiln {'None' if a is None else 'a tensor'}, eager {'None' if e is None else 'a tensor'}"
        if e is None:
            continue
        try:
            assert_same(a, e, path=f"grad[{i}]")
        except AssertionError as err:
            return f"backward: {str(err)[:600]}"
    return None


def samples_of(op):
    out = []
    with torch.random.fork_rng():
        torch.manual_seed(0)
        for s in op.sample_inputs("cpu", D, requires_grad=True):
            if _numel(s) <= MAX_NUMEL:
                out.append(s)
            if len(out) >= MAX_SAMPLES:
                break
    return out


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout(f"over {TIMEOUT_S}s")


def _run_variant(op, samples, **compile_kwargs):
    """Problems of one fresh compiled function over the samples (first problem only), and
    kiln's counters after it."""
    kiln.reset()
    fn = _eager_fn(op, user=True)

    def wrapper(*a, **k):  # fresh per op and variant
        return fn(*a, **k)
    cf = kiln.compile(wrapper, **compile_kwargs)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(TIMEOUT_S)
    try:
        for i, s in enumerate(samples):
            p = check_sample(op, s, cf)
            if p:
                return f"sample {i}: {p}", kiln.stats()
    except _Timeout as e:
        return f"timeout: {e}", kiln.stats()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return None, kiln.stats()


def _last_grad_only(s):
    """The sample with only its last tensor that requires grad still requiring it."""
    last = [t for t in _tensors((s.input, s.args, s.kwargs)) if t.requires_grad][-1:]
    return s.transform(lambda t: t if not isinstance(t, torch.Tensor) or any(t is x for x in last)
                       else t.detach())


# the variants each op runs: (name, how its samples are made from the op's, compile keywords)
VARIANTS = {
    "static": (lambda ss: ss, {}),
    "noncontiguous": (lambda ss: [s.noncontiguous() for s in ss], {}),
    "dynamic": (lambda ss: ss, {"dynamic": True}),
    # not run by default (KILN_OPINFO_GRAD_VARIANTS): each sample twice (the second call hits
    # the cache), and only the last input requiring grad
    "repeat": (lambda ss: [s for s in ss for _ in range(2)], {}),
    "last_grad_only": (lambda ss: [_last_grad_only(s) for s in ss], {}),
}
RUN_VARIANTS = os.environ.get("KILN_OPINFO_GRAD_VARIANTS", "static,noncontiguous,dynamic").split(",")


def check_op(op):
    """(status, detail, info): status 'pass', 'fail' or 'skip'."""
    samples = samples_of(op)
    if not samples:
        return "skip", "no small sample", {}
    if _is_random(op, samples[0]):
        return "skip", "random", {}
    problems, info = [], {}
    for name in RUN_VARIANTS:
        make, kw = VARIANTS[name]
        p, st = _run_variant(op, make(samples), **kw)
        if p:
            problems.append(f"{name}: {p}")
        if not info:  # kiln's counters from the first variant: did it build a backward graph
            info = {k: st[k] for k in ("graphs_compiled", "backward_graphs_compiled", "eager_fallbacks",
                                       "graph_breaks", "kernels_generated")}
            info["fallback_reasons"] = {str(k)[:200]: v for k, v in dict(st.get("fallback_reasons", {})).items()}
    info["samples"] = len(samples)
    return ("fail" if problems else "pass"), "; ".join(problems), info


def _log(name, status, detail, info):
    path = os.environ.get("KILN_OPINFO_GRAD_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(dict(op=name, status=status, detail=detail, **info)) + "\n")


def _params():
    for name in OPS:
        marks = [pytest.mark.xfail(strict=True, reason=XFAIL[name])] if name in XFAIL else []
        yield pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", list(_params()))
def test_opinfo_grad(name):
    status, detail, info = check_op(OPS[name])
    _log(name, status, detail, info)
    if status == "skip":
        pytest.skip(detail)
    assert status == "pass", detail
