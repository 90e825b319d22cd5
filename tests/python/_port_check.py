"""The comparison behind the ports of TorchDynamo's tests (test_port_dynamo_misc1.py,
test_port_dynamo_misc2.py, test_port_dynamo_repros.py): each case runs eagerly and under
kiln.compile on fresh inputs (twice, so a stale guard shows) and compares results, raised
exception types and what the call did to its arguments; `not_more_than_dynamo` compares kiln's
graph / break counts with torch._dynamo.explain's on the same code (kiln may have fewer, never
more)."""
import collections
import math

import torch
import torch._dynamo

import kiln


def same(a, b, path="out"):
    if isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor), f"{path}: {type(a)} is not a Tensor"
        assert a.shape == b.shape and a.dtype == b.dtype, f"{path}: {a.shape}/{a.dtype} != {b.shape}/{b.dtype}"
        assert a.requires_grad == b.requires_grad, f"{path}: requires_grad {a.requires_grad} != {b.requires_grad}"
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1.3e-6, atol=1e-5, equal_nan=True,
                                   msg=lambda m: f"{path}: {m}")
    elif isinstance(b, dict):
        assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
        assert list(a.keys()) == list(b.keys()), f"{path}: keys {list(a)} != {list(b)}"
        for k in b:
            same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(b, (list, tuple, collections.deque)):
        assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
        assert len(a) == len(b), f"{path}: len {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
    elif isinstance(b, float):
        assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
        assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9), f"{path}: {a} != {b}"
    elif isinstance(b, (bool, int, str, complex, type(None), torch.dtype, torch.Size)):
        assert type(a) is type(b), f"{path}: {type(a)} != {type(b)} ({a!r} vs {b!r})"
        assert a == b, f"{path}: {a!r} != {b!r}"
    elif type(b).__eq__ is object.__eq__ and hasattr(b, "__dict__") and not callable(b):
        assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
        same(dict(vars(a)), dict(vars(b)), path + ".__dict__")
    else:
        assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
        assert a == b, f"{path}: {a!r} != {b!r}"


def clone_tree(v):
    if isinstance(v, torch.Tensor):
        c = v.detach().clone()
        if v.requires_grad:
            c.requires_grad_()
        if v.grad is not None:
            c.grad = v.grad.detach().clone()
        return c
    if isinstance(v, list):
        return [clone_tree(x) for x in v]
    if isinstance(v, tuple) and not hasattr(v, "_fields"):
        return tuple(clone_tree(x) for x in v)
    if type(v) is dict:
        return {k: clone_tree(x) for k, x in v.items()}
    return v


def outcome(fn, args):
    try:
        return "ok", fn(*args)
    except Exception as e:  # noqa: BLE001
        outcome.last = f"{type(e).__name__}: {str(e)[:300]}"
        return "raised", type(e)


def check(fn, make_args=lambda: (), calls=2, counts=True, compiled=None, graphs_only=False, **kw):
    """Eager and kiln on copies of fresh args, `calls` times: same result or same exception type,
    same effect on the arguments; then kiln's graph/break counts <= TorchDynamo's."""
    c = compiled or kiln.compile(fn, **kw)
    for _ in range(calls):
        args = make_args()
        ea, ka = clone_tree(args), clone_tree(args)
        want = outcome(fn, ea)
        outcome.last = None
        got = outcome(c, ka)
        assert got[0] == want[0], f"kiln {got} ({outcome.last}), eager {want}"
        same(got[1], want[1])
        same(ka, ea, "args")
    if counts:
        not_more_than_dynamo(fn, make_args, graphs_only=graphs_only, **kw)
    return c


def kiln_counts(fn, *args, **kw):
    e = kiln.explain(kiln.compile(fn, **kw))(*args)
    kiln_counts.reasons = [str(r) for r in e.break_reasons]
    return e.graph_count, e.graph_break_count


def dynamo_counts(fn, *args):
    torch._dynamo.reset()
    try:
        r = torch._dynamo.explain(fn)(*args)
    finally:
        torch._dynamo.reset()
    return r.graph_count, r.graph_break_count


def not_more_than_dynamo(fn, make_args, graphs_only=False, **kw):
    """graphs_only: for an explicit torch._dynamo.graph_break() in a loop or at a frame's start,
    where TorchDynamo skips the frame instead of counting a break."""
    kg, kb = kiln_counts(fn, *clone_tree(make_args()), **kw)
    dg, db = dynamo_counts(fn, *clone_tree(make_args()))
    if dg == 0:
        return kg, kb
    assert kg <= dg and (graphs_only or kb <= db), f"kiln {kg} graphs / {kb} breaks, TorchDynamo {dg} / {db}: {kiln_counts.reasons}"
    assert dg == 0 or kg > 0, "kiln captured nothing where TorchDynamo captured a graph"
    return kg, kb


def recompiles(fn, calls, **kw):
    kiln.reset()
    c = kiln.compile(fn, **kw)
    for args in calls:
        same(c(*clone_tree(args)), fn(*clone_tree(args)))
    return kiln.stats()["graphs_compiled"]


def dynamo_frames(fn, calls, **kw):
    torch._dynamo.reset()
    cnt = torch._dynamo.testing.CompileCounter()
    opt = torch.compile(fn, backend=cnt, **kw)
    for args in calls:
        opt(*clone_tree(args))
    torch._dynamo.reset()
    return cnt.frame_count


def t(*shape):
    return lambda: (torch.randn(*shape),)
