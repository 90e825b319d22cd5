"""Training loops with torch.optim under kiln.compile, after torch's
test/inductor/test_compiled_optimizers.py and test/test_optim.py (the per-optimizer
configurations follow torch.testing._internal.common_optimizers' OptimizerInfo lists, written
anew here).

Three shapes of compiled code are compared with an identical eager copy (``copy.deepcopy`` of
the model, a fresh optimizer with the same settings) after every step -- parameters, optimizer
state and losses:

(a) the optimizer step alone compiled (``kiln.compile(opt.step)`` / a function calling it),
(b) a whole training step compiled (forward, loss, backward, step, zero_grad),
(c) a compiled model trained by an eager optimizer.

Around them: parameter groups, tensor learning rates, LR schedulers (also counting recompiles
against TorchDynamo's on the same code), gradient clipping, zero_grad, swa_utils averaging,
state_dict/load_state_dict between compiled steps, and hyperparameters changed between steps.
"""
from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import kiln

O = torch.optim
LS = torch.optim.lr_scheduler

warnings.filterwarnings("ignore", message=".*lr_scheduler.step.*")


pytestmark = pytest.mark.usefixtures("quiet_fallbacks")


TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-12)}


# --------------------------------------------------------------------------------------------
# helpers


def _model(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(), torch.nn.Linear(10, 3)).to(dtype)


def _batches(n, dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(5, 6, generator=g, dtype=dtype), torch.randn(5, 3, generator=g, dtype=dtype))
            for _ in range(n)]


def _loss_fn(out, y):
    return F.mse_loss(out, y)


def _assert_state_equal(o1, o2, tol):
    """Optimizer state (tensors and numbers, per parameter in order) and the param groups'
    hyperparameters of two optimizers are equal."""
    s1, s2 = o1.state_dict(), o2.state_dict()
    assert sorted(s1["state"]) == sorted(s2["state"])
    for k in s1["state"]:
        a, b = s1["state"][k], s2["state"][k]
        assert sorted(a) == sorted(b), (a.keys(), b.keys())
        for name in a:
            if isinstance(a[name], torch.Tensor):
                torch.testing.assert_close(a[name], b[name], **tol, msg=lambda m: f"state {k}/{name}: {m}")
            else:
                assert a[name] == pytest.approx(b[name]), (k, name)
    assert len(s1["param_groups"]) == len(s2["param_groups"])
    for g1, g2 in zip(s1["param_groups"], s2["param_groups"]):
        for key in g1:
            v1, v2 = g1[key], g2[key]
            if isinstance(v1, torch.Tensor):
                torch.testing.assert_close(v1, v2, **tol)
            elif isinstance(v1, float):
                assert v1 == pytest.approx(v2, rel=1e-12), key
            else:
                assert v1 == v2, key


def _assert_same(m1, m2, o1, o2, tol):
    torch.testing.assert_close(list(m1.parameters()), list(m2.parameters()), **tol)
    _assert_state_equal(o1, o2, tol)


def _pair(make_opt, dtype=torch.float32):
    m = _model(dtype)
    r = copy.deepcopy(m)
    return m, r, make_opt(m.parameters()), make_opt(r.parameters())


def _our_recompiles(qualname_part):
    return [r for r in kiln.stats()["recompile_reasons"] if qualname_part in r]


class _Counter:
    """A TorchDynamo backend that counts the graphs it is given and runs them as they are."""

    def __init__(self):
        self.frames = 0

    def __call__(self, gm, example_inputs):
        self.frames += 1
        return gm.forward


# --------------------------------------------------------------------------------------------
# optimizer configurations (one entry per OptimizerInfo-style kwargs set)

CONFIGS = {
    # SGD
    "sgd": lambda p: O.SGD(p, lr=0.05),
    "sgd_momentum": lambda p: O.SGD(p, lr=0.05, momentum=0.9),
    "sgd_momentum_dampening": lambda p: O.SGD(p, lr=0.05, momentum=0.9, dampening=0.5),
    "sgd_nesterov": lambda p: O.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
    "sgd_weight_decay": lambda p: O.SGD(p, lr=0.05, weight_decay=0.1),
    "sgd_weight_decay_maximize": lambda p: O.SGD(p, lr=0.05, weight_decay=0.1, maximize=True),
    "sgd_momentum_nesterov_wd_foreach_false": lambda p: O.SGD(p, lr=0.05, momentum=0.9, nesterov=True,
                                                                weight_decay=0.1, foreach=False),
    "sgd_tensor_lr": lambda p: O.SGD(p, lr=torch.tensor(0.05), momentum=0.9),
    # Adam
    "adam": lambda p: O.Adam(p, lr=1e-2),
    "adam_amsgrad": lambda p: O.Adam(p, lr=1e-2, amsgrad=True),
    "adam_weight_decay": lambda p: O.Adam(p, lr=1e-2, weight_decay=0.1),
    "adam_maximize": lambda p: O.Adam(p, lr=1e-2, maximize=True),
    "adam_foreach_false": lambda p: O.Adam(p, lr=1e-2, foreach=False, amsgrad=True, weight_decay=0.05),
    "adam_foreach_true": lambda p: O.Adam(p, lr=1e-2, foreach=True),
    "adam_fused_false": lambda p: O.Adam(p, lr=1e-2, fused=False),
    "adam_betas_eps": lambda p: O.Adam(p, lr=1e-2, betas=(0.8, 0.9), eps=1e-3),
    "adam_tensor_lr": lambda p: O.Adam(p, lr=torch.tensor(1e-2), foreach=False),
    # AdamW
    "adamw": lambda p: O.AdamW(p, lr=1e-2),
    "adamw_amsgrad": lambda p: O.AdamW(p, lr=1e-2, amsgrad=True),
    "adamw_weight_decay_maximize": lambda p: O.AdamW(p, lr=1e-2, weight_decay=0.3, maximize=True),
    "adamw_foreach_false": lambda p: O.AdamW(p, lr=1e-2, foreach=False),
    "adamw_tensor_lr": lambda p: O.AdamW(p, lr=torch.tensor(1e-2), foreach=False, amsgrad=True),
    # RMSprop
    "rmsprop": lambda p: O.RMSprop(p, lr=1e-2),
    "rmsprop_centered": lambda p: O.RMSprop(p, lr=1e-2, centered=True),
    "rmsprop_momentum": lambda p: O.RMSprop(p, lr=1e-2, momentum=0.9),
    "rmsprop_centered_momentum_wd_maximize": lambda p: O.RMSprop(p, lr=1e-2, centered=True, momentum=0.9,
                                                                 weight_decay=0.1, maximize=True),
    "rmsprop_foreach_false": lambda p: O.RMSprop(p, lr=1e-2, foreach=False, alpha=0.9),
    # Adagrad
    "adagrad": lambda p: O.Adagrad(p, lr=0.1),
    "adagrad_lr_decay_wd": lambda p: O.Adagrad(p, lr=0.1, lr_decay=0.5, weight_decay=0.1),
    "adagrad_initial_accumulator_maximize": lambda p: O.Adagrad(p, lr=0.1, initial_accumulator_value=0.1,
                                                                maximize=True),
    # Adadelta
    "adadelta": lambda p: O.Adadelta(p),
    "adadelta_rho_wd_maximize": lambda p: O.Adadelta(p, lr=0.5, rho=0.8, weight_decay=0.1, maximize=True),
    # Adamax
    "adamax": lambda p: O.Adamax(p, lr=1e-2),
    "adamax_wd_maximize": lambda p: O.Adamax(p, lr=1e-2, weight_decay=0.1, maximize=True),
    # NAdam
    "nadam": lambda p: O.NAdam(p, lr=1e-2),
    "nadam_momentum_decay_wd": lambda p: O.NAdam(p, lr=1e-2, momentum_decay=6e-3, weight_decay=0.1),
    "nadam_decoupled": lambda p: O.NAdam(p, lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True),
    # RAdam (its rectification only kicks in after a few steps: 5 steps cover both branches)
    "radam": lambda p: O.RAdam(p, lr=1e-2),
    "radam_decoupled": lambda p: O.RAdam(p, lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True),
    "radam_betas": lambda p: O.RAdam(p, lr=1e-2, betas=(0.5, 0.6)),
    # ASGD
    "asgd": lambda p: O.ASGD(p, lr=1e-2),
    "asgd_t0_lambd_wd_maximize": lambda p: O.ASGD(p, lr=1e-2, t0=2, lambd=0.1, weight_decay=0.1, maximize=True),
    # Rprop
    "rprop": lambda p: O.Rprop(p, lr=1e-2),
    "rprop_etas_step_sizes_maximize": lambda p: O.Rprop(p, lr=1e-2, etas=(0.3, 1.5), step_sizes=(1e-4, 0.1),
                                                        maximize=True),
}

# the float64 runs: one or two per optimizer class
CONFIGS_F64 = ["sgd_momentum_dampening", "sgd_nesterov", "adam_amsgrad", "adamw_weight_decay_maximize",
               "rmsprop_centered_momentum_wd_maximize", "adagrad_lr_decay_wd", "adadelta_rho_wd_maximize",
               "adamax_wd_maximize", "nadam_decoupled", "radam_decoupled", "asgd_t0_lambd_wd_maximize",
               "rprop_etas_step_sizes_maximize"]

# one configuration per class (for shapes (a) and (c) and the capture comparison)
PER_CLASS = {
    "SGD": "sgd_momentum", "Adam": "adam", "AdamW": "adamw", "RMSprop": "rmsprop_centered",
    "Adagrad": "adagrad", "Adadelta": "adadelta", "Adamax": "adamax", "NAdam": "nadam_decoupled",
    "RAdam": "radam_decoupled", "ASGD": "asgd", "Rprop": "rprop",
}

# kiln captures torch.optim's SGD/Adam/AdamW steps as update math and traces the other
# optimizers' functional updates (Rprop's clone(memory_format=) too); RAdam (a branch on its
# rectification term) and ASGD (a torch call whose meta run fails) still stop capture.
NOT_CAPTURED = {"RAdam", "ASGD"}
XFAIL_CAPTURE = pytest.mark.xfail(strict=True, reason=(
    "kiln runs this optimizer's step eagerly where TorchDynamo captures one graph"))


# --------------------------------------------------------------------------------------------
# (b) a whole training step compiled


def _whole_step(model, opt):
    def step(x, y):
        loss = _loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    return step


def _run_whole(make_opt, dtype, steps=5, sched=None, sched_inside=False):
    kiln.reset()
    m, r, o1, o2 = _pair(make_opt, dtype)
    s1 = sched(o1) if sched else None
    s2 = sched(o2) if sched else None
    compiled = kiln.compile(_whole_step(m, o1))
    eager = _whole_step(r, o2)
    for i, (x, y) in enumerate(_batches(steps, dtype)):
        l1, l2 = compiled(x, y), eager(x, y)
        torch.testing.assert_close(l1, l2, **TOL[dtype])
        for s, loss in ((s1, l1), (s2, l2)):
            if s is not None:
                s.step(loss.item()) if isinstance(s, LS.ReduceLROnPlateau) else s.step()
        _assert_same(m, r, o1, o2, TOL[dtype])
        assert all(p.grad is None for p in m.parameters())
    return m, o1


def _whole_step_recompiles_at_most(n):
    ours = _our_recompiles("_whole_step")
    assert len(ours) <= n, ours


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_whole_step_float32(name):
    _run_whole(CONFIGS[name], torch.float32)
    # SGD's first step with dampening runs eagerly and the next compiles (kiln's docs); the
    # steps kiln runs eagerly go through torch._disable_dynamo, which caches an attribute on the
    # function at its first call in the process (one recompile at most)
    captured = name.startswith(("sgd", "adam_", "adamw")) or name == "adam"
    _whole_step_recompiles_at_most(1 if "dampening" in name or not captured else 0)


@pytest.mark.parametrize("name", CONFIGS_F64)
def test_whole_step_float64(name):
    _run_whole(CONFIGS[name], torch.float64)


# --------------------------------------------------------------------------------------------
# (a) the step alone compiled: kiln.compile(opt.step), gradients set eagerly


def _grads(model, dtype, n, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(p.shape, generator=g, dtype=dtype) for p in model.parameters()] for _ in range(n)]


def _run_step_only(make_opt, dtype, steps=5, wrap=False):
    kiln.reset()
    m, r, o1, o2 = _pair(make_opt, dtype)
    if wrap:
        def fn():
            o1.step()
        compiled = kiln.compile(fn)
    else:
        compiled = kiln.compile(o1.step)
    for gs in _grads(m, dtype, steps):
        for p, q, g in zip(m.parameters(), r.parameters(), gs):
            p.grad, q.grad = g.clone(), g.clone()
        compiled()
        o2.step()
        _assert_same(m, r, o1, o2, TOL[dtype])


@pytest.mark.parametrize("name", sorted(PER_CLASS.values()))
def test_compiled_opt_step_float32(name):
    _run_step_only(CONFIGS[name], torch.float32)


@pytest.mark.parametrize("name", CONFIGS_F64)
def test_compiled_opt_step_float64(name):
    _run_step_only(CONFIGS[name], torch.float64)


@pytest.mark.parametrize("name", ["sgd_weight_decay_maximize", "adam_maximize", "adamw_tensor_lr", "nadam",
                                  "rprop"])
def test_function_calling_opt_step(name):
    _run_step_only(CONFIGS[name], torch.float32, wrap=True)


# --------------------------------------------------------------------------------------------
# (c) a compiled model, the optimizer eager


@pytest.mark.parametrize("name", sorted(PER_CLASS.values()))
def test_compiled_model_eager_optimizer(name):
    kiln.reset()
    m, r, o1, o2 = _pair(CONFIGS[name])
    cm = kiln.compile(m)
    for x, y in _batches(5):
        l1 = _loss_fn(cm(x), y)
        l2 = _loss_fn(r(x), y)
        torch.testing.assert_close(l1, l2, **TOL[torch.float32])
        l1.backward(), l2.backward()
        o1.step(), o2.step()
        o1.zero_grad(), o2.zero_grad()
        _assert_same(m, r, o1, o2, TOL[torch.float32])
    # the optimizer updating the parameters in place does not recompile the model
    assert kiln.stats()["recompiles"] == 0, kiln.stats()["recompile_reasons"]


# --------------------------------------------------------------------------------------------
# capture of the step compared with TorchDynamo's


@pytest.mark.parametrize("cls", [pytest.param(c, marks=XFAIL_CAPTURE) if c in NOT_CAPTURED else c
                                 for c in sorted(PER_CLASS)])
def test_step_graph_count_vs_dynamo(cls):
    make = CONFIGS[PER_CLASS[cls]]
    m = _model()
    opt = make(m.parameters())
    for p, g in zip(m.parameters(), _grads(m, torch.float32, 1)[0]):
        p.grad = g
    opt.step()  # the state exists: both capture a steady-state step

    def step():
        opt.step()

    torch._dynamo.reset()
    theirs = torch._dynamo.explain(step)()
    kiln.reset()
    mine = kiln.explain(step)()
    assert theirs.graph_count == 1 and theirs.graph_break_count == 0
    assert mine.graph_count >= 1, f"kiln ran the step eagerly: {mine.break_reasons}"
    assert mine.graph_count <= theirs.graph_count and mine.graph_break_count <= theirs.graph_break_count


XFAIL_BOUND = pytest.mark.xfail(strict=True, reason=(
    "kiln.compile(opt.step) of this optimizer runs its step eagerly; TorchDynamo captures one graph"))


@pytest.mark.parametrize("cls", [pytest.param(c, marks=XFAIL_BOUND) if c in NOT_CAPTURED else c
                                 for c in sorted(PER_CLASS)])
def test_compiled_bound_opt_step_graph_count_vs_dynamo(cls):
    m = _model()
    opt = CONFIGS[PER_CLASS[cls]](m.parameters())
    for p, g in zip(m.parameters(), _grads(m, torch.float32, 1)[0]):
        p.grad = g
    opt.step()
    torch._dynamo.reset()
    theirs = torch._dynamo.explain(opt.step)()
    kiln.reset()
    mine = kiln.explain(opt.step)()
    assert theirs.graph_count == 1 and theirs.graph_break_count == 0
    assert mine.graph_count >= 1, f"kiln ran the step eagerly: {mine.break_reasons}"


# --------------------------------------------------------------------------------------------
# parameter groups


@pytest.mark.parametrize("cls", ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "NAdam"])
def test_param_groups_with_different_lrs(cls):
    def make(params):
        ps = list(params)
        groups = [{"params": ps[:2], "lr": 0.02}, {"params": ps[2:], "lr": 0.002, "weight_decay": 0.1}]
        kw = {"momentum": 0.9} if cls in ("SGD", "RMSprop") else {}
        return getattr(O, cls)(groups, lr=0.01, **kw)
    _run_whole(make, torch.float32)


def test_param_group_added_between_compiled_steps():
    kiln.reset()
    m, r = _model(), None
    r = copy.deepcopy(m)
    o1 = O.Adam(list(m[0].parameters()), lr=1e-2)
    o2 = O.Adam(list(r[0].parameters()), lr=1e-2)
    c, e = kiln.compile(_whole_step(m, o1)), _whole_step(r, o2)
    for i, (x, y) in enumerate(_batches(5)):
        if i == 2:
            o1.add_param_group({"params": list(m[2].parameters()), "lr": 0.05})
            o2.add_param_group({"params": list(r[2].parameters()), "lr": 0.05})
        torch.testing.assert_close(c(x, y), e(x, y))
        _assert_same(m, r, o1, o2, TOL[torch.float32])


def test_frozen_parameter_in_group_skipped():
    kiln.reset()
    m, r, o1, o2 = _pair(lambda p: O.SGD(p, lr=0.05, momentum=0.9))
    m[0].bias.requires_grad_(False)
    r[0].bias.requires_grad_(False)
    c, e = kiln.compile(_whole_step(m, o1)), _whole_step(r, o2)
    for x, y in _batches(4):
        torch.testing.assert_close(c(x, y), e(x, y))
        _assert_same(m, r, o1, o2, TOL[torch.float32])


# --------------------------------------------------------------------------------------------
# hyperparameters changed between compiled steps (guards)


@pytest.mark.parametrize("key,before,after,make", [
    ("weight_decay", 0.0, 0.2, lambda p: O.SGD(p, lr=0.05, momentum=0.9)),
    ("momentum", 0.0, 0.9, lambda p: O.SGD(p, lr=0.05)),
    ("maximize", False, True, lambda p: O.SGD(p, lr=0.05, momentum=0.5)),
    ("nesterov", False, True, lambda p: O.SGD(p, lr=0.05, momentum=0.5)),
    ("weight_decay", 0.0, 0.2, lambda p: O.Adam(p, lr=1e-2)),
    ("amsgrad", False, True, lambda p: O.Adam(p, lr=1e-2)),
    ("maximize", False, True, lambda p: O.AdamW(p, lr=1e-2)),
    ("betas", (0.9, 0.999), (0.5, 0.6), lambda p: O.Adam(p, lr=1e-2)),
    ("eps", 1e-8, 1e-1, lambda p: O.AdamW(p, lr=1e-2)),
    ("centered", False, True, lambda p: O.RMSprop(p, lr=1e-2)),
    ("dampening", 0.0, 0.5, lambda p: O.SGD(p, lr=0.05, momentum=0.9)),
    ("lr", 0.0, 0.05, lambda p: O.SGD(p, lr=0.05)),
    ("lr", 0.0, 0.01, lambda p: O.Adam(p, lr=1e-2)),
    ("lr", 1e-2, -1e-2, lambda p: O.AdamW(p, lr=1e-2)),
    ("betas", (0.0, 0.999), (0.9, 0.999), lambda p: O.Adam(p, lr=1e-2)),
    ("eps", 0.0, 1e-3, lambda p: O.Adam(p, lr=1e-2)),
    ("foreach", None, False, lambda p: O.Adam(p, lr=1e-2)),
    ("weight_decay", 0.1, -0.1, lambda p: O.AdamW(p, lr=1e-2)),
    ("lr", 1e-2, "tensor", lambda p: O.Adam(p, lr=1e-2, foreach=False)),
])
def test_hyperparameter_changed_between_steps(key, before, after, make):
    kiln.reset()
    m, r, o1, o2 = _pair(make)
    for o in (o1, o2):
        for g in o.param_groups:
            g[key] = before
    c, e = kiln.compile(_whole_step(m, o1)), _whole_step(r, o2)
    for i, (x, y) in enumerate(_batches(5)):
        if i == 2:
            for o in (o1, o2):
                for g in o.param_groups:
                    g[key] = torch.tensor(0.005) if after == "tensor" else after
        if i >= 2 and key in ("amsgrad", "centered"):
            # the state made without the flag lacks the new buffer: eager raises KeyError
            with pytest.raises(KeyError) as eager_err:
                e(x, y)
            with pytest.raises(KeyError) as kiln_err:
                c(x, y)
            assert str(kiln_err.value) == str(eager_err.value)
            m.zero_grad(), r.zero_grad()
        else:
            torch.testing.assert_close(c(x, y), e(x, y))
        _assert_same(m, r, o1, o2, TOL[torch.float32])


# --------------------------------------------------------------------------------------------
# LR schedulers


SCHEDULERS = {
    "StepLR": lambda o: LS.StepLR(o, step_size=1, gamma=0.7),
    "MultiStepLR": lambda o: LS.MultiStepLR(o, milestones=[1, 3], gamma=0.3),
    "ExponentialLR": lambda o: LS.ExponentialLR(o, gamma=0.8),
    "CosineAnnealingLR": lambda o: LS.CosineAnnealingLR(o, T_max=4),
    "OneCycleLR": lambda o: LS.OneCycleLR(o, max_lr=0.05, total_steps=10),
    "LambdaLR": lambda o: LS.LambdaLR(o, lr_lambda=lambda s: 1.0 / (s + 1)),
    "LinearLR": lambda o: LS.LinearLR(o, start_factor=0.2, total_iters=4),
    "SequentialLR": lambda o: LS.SequentialLR(o, [LS.ConstantLR(o, factor=0.5, total_iters=2),
                                                  LS.ExponentialLR(o, gamma=0.9)], milestones=[2]),
    "ReduceLROnPlateau": lambda o: LS.ReduceLROnPlateau(o, factor=0.5, patience=0, threshold=10.0),
    "CyclicLR": lambda o: LS.CyclicLR(o, base_lr=0.001, max_lr=0.02, step_size_up=2, cycle_momentum=False),
    "CosineAnnealingWarmRestarts": lambda o: LS.CosineAnnealingWarmRestarts(o, T_0=2),
    "PolynomialLR": lambda o: LS.PolynomialLR(o, total_iters=4, power=2.0),
}


@pytest.mark.parametrize("sched", sorted(SCHEDULERS))
@pytest.mark.parametrize("opt", ["sgd_momentum", "adamw"])
def test_lr_scheduler_outside_compiled_step(sched, opt):
    m, o = _run_whole(CONFIGS[opt], torch.float32, steps=6, sched=SCHEDULERS[sched])
    assert _our_recompiles("_whole_step") == [], kiln.stats()["recompile_reasons"]


XFAIL_GET = pytest.mark.xfail(strict=True, reason=(
    "float64 parameters: the optimizer's functional update runs in Python (compiled, torch.optim "
    "derives step sizes from a float32 step count), and the resume function after it guards lr by "
    "value, recompiling at each scheduler change"))


@pytest.mark.parametrize("sched", ["StepLR", "OneCycleLR", "CosineAnnealingLR", "ExponentialLR"])
@pytest.mark.parametrize("opt", ["adam_tensor_lr", pytest.param("rmsprop", marks=XFAIL_GET),
                                 pytest.param("adagrad", marks=XFAIL_GET)])
def test_lr_scheduler_other_optimizers(sched, opt):
    # float64: RMSprop's g / sqrt(v) early on and OneCycleLR's large rate amplify float32
    # rounding of the gradients past 1e-5
    _run_whole(CONFIGS[opt], torch.float64, steps=6, sched=SCHEDULERS[sched])
    assert _our_recompiles("_whole_step") == [], kiln.stats()["recompile_reasons"]


def _sched_inside(model, opt, sched):
    def step(x, y):
        loss = _loss_fn(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        return loss
    return step


@pytest.mark.parametrize("sched", ["StepLR", "ExponentialLR", "CosineAnnealingLR", "LambdaLR", "OneCycleLR"])
def test_lr_scheduler_step_inside_compiled_function(sched):
    kiln.reset()
    m, r, o1, o2 = _pair(CONFIGS["adamw"])
    s1, s2 = SCHEDULERS[sched](o1), SCHEDULERS[sched](o2)
    c, e = kiln.compile(_sched_inside(m, o1, s1)), _sched_inside(r, o2, s2)
    for x, y in _batches(6):
        torch.testing.assert_close(c(x, y), e(x, y), **TOL[torch.float32])
        _assert_same(m, r, o1, o2, TOL[torch.float32])
        assert s1.last_epoch == s2.last_epoch and s1.get_last_lr() == pytest.approx(s2.get_last_lr())


def _recompile_counts(make_opt, sched, steps=6):
    """(kiln's, TorchDynamo's) count of compiled frames of the whole step over `steps` steps
    with a scheduler changing the rate after each."""
    counts = []
    for which in ("kiln", "dynamo"):
        kiln.reset()
        torch._dynamo.reset()
        m = _model()
        o = make_opt(m.parameters())
        s = sched(o)
        if which == "kiln":
            fn = kiln.compile(_whole_step(m, o))
        else:
            cnt = _Counter()
            fn = torch.compile(_whole_step(m, o), backend=cnt)
        for x, y in _batches(steps):
            fn(x, y)
            s.step()
        if which == "kiln":
            counts.append(1 + len(_our_recompiles("_whole_step")))
        else:
            counts.append(cnt.frames)
    torch._dynamo.reset()
    return counts


@pytest.mark.parametrize("opt,sched", [("sgd_momentum", "StepLR"), ("adamw", "CosineAnnealingLR"),
                                       ("adam_tensor_lr", "ExponentialLR"),
                                       ("rmsprop", "StepLR"), ("nadam", "CosineAnnealingLR")])
def test_scheduler_recompiles_vs_dynamo(opt, sched):
    mine, theirs = _recompile_counts(CONFIGS[opt], SCHEDULERS[sched])
    assert mine <= 2, mine  # not once per step
    assert mine <= max(theirs, 2), (mine, theirs)


# --------------------------------------------------------------------------------------------
# lr as a tensor, changed in place


@pytest.mark.parametrize("name", ["sgd_tensor_lr", "adam_tensor_lr", "adamw_tensor_lr"])
def test_tensor_lr_filled_in_place(name):
    kiln.reset()
    m, r, o1, o2 = _pair(CONFIGS[name])
    c, e = kiln.compile(_whole_step(m, o1)), _whole_step(r, o2)
    for i, (x, y) in enumerate(_batches(5)):
        torch.testing.assert_close(c(x, y), e(x, y))
        _assert_same(m, r, o1, o2, TOL[torch.float32])
        for o in (o1, o2):
            o.param_groups[0]["lr"].fill_(0.1 / (i + 2))
    assert _our_recompiles("_whole_step") == []


# --------------------------------------------------------------------------------------------
# gradient clipping


def _clipped_step(model, opt, how):
    def step(x, y):
        loss = _loss_fn(model(x), y)
        loss.backward()
        out = None
        if how == "norm":
            out = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.05)
        elif how == "norm_inf":
            out = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.05, norm_type="inf")
        elif how == "norm_foreach_false":
            out = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.05, foreach=False)
        elif how == "value":
            torch.nn.utils.clip_grad_value_(model.parameters(), clip_value=0.01)
        elif how == "value_foreach_false":
            torch.nn.utils.clip_grad_value_(model.parameters(), clip_value=0.01, foreach=False)
        opt.step()
        opt.zero_grad()
        return loss, out
    return step


@pytest.mark.parametrize("how", ["norm", "norm_inf", "norm_foreach_false", "value", "value_foreach_false"])
@pytest.mark.parametrize("opt", ["sgd_momentum", "adamw", "rmsprop"])
def test_grad_clipping(how, opt):
    kiln.reset()
    m, r, o1, o2 = _pair(CONFIGS[opt])
    c, e = kiln.compile(_clipped_step(m, o1, how)), _clipped_step(r, o2, how)
    for x, y in _batches(4):
        torch.testing.assert_close(c(x, y), e(x, y), **TOL[torch.float32])
        _assert_same(m, r, o1, o2, TOL[torch.float32])


def test_clip_grad_value_graph_count_vs_dynamo():
    m = _model()
    opt = O.SGD(m.parameters(), lr=0.1)
    step = _clipped_step(m, opt, "value")
    x, y = _batches(1)[0]
    torch._dynamo.reset()
    theirs = torch._dynamo.explain(step)(x, y)
    m.zero_grad()
    mine = kiln.explain(step)(x, y)
    assert mine.graph_count <= theirs.graph_count, (str(mine), theirs.graph_count)
    assert mine.graph_break_count <= theirs.graph_break_count, mine.break_reasons


# --------------------------------------------------------------------------------------------
# zero_grad


@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.parametrize("opt", ["sgd_momentum", "adam", "adagrad"])
def test_zero_grad_set_to_none(set_to_none, opt):
    kiln.reset()
    m, r, o1, o2 = _pair(CONFIGS[opt])

    def mk(model, o):
        def step(x, y):
            o.zero_grad(set_to_none=set_to_none)
            loss = _loss_fn(model(x), y)
            loss.backward()
            o.step()
            return loss
        return step

    c, e = kiln.compile(mk(m, o1)), mk(r, o2)
    for x, y in _batches(4):
        torch.testing.assert_close(c(x, y), e(x, y))
        _assert_same(m, r, o1, o2, TOL[torch.float32])
        for p, q in zip(m.parameters(), r.parameters()):
            torch.testing.assert_close(p.grad, q.grad)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad_alone_compiled(set_to_none):
    m = _model()
    opt = O.Adagrad(m.parameters())
    grads = []
    for p in m.parameters():
        p.grad = torch.randn_like(p)
        grads.append(p.grad)
    kiln.compile(lambda: opt.zero_grad(set_to_none=set_to_none))()
    if set_to_none:
        assert all(p.grad is None for p in m.parameters())
    else:
        assert all(p.grad is g and bool((g == 0).all()) for p, g in zip(m.parameters(), grads))


def test_model_zero_grad_in_compiled_step():
    kiln.reset()
    m, r, o1, o2 = _pair(CONFIGS["adam"])

    def mk(model, o):
        def step(x, y):
            model.zero_grad(set_to_none=False)
            loss = _loss_fn(model(x), y)
            loss.backward()
            o.step()
            return loss
        return step

    c, e = kiln.compile(mk(m, o1)), mk(r, o2)
    for x, y in _batches(4):
        torch.testing.assert_close(c(x, y), e(x, y))
        _assert_same(m, r, o1, o2, TOL[torch.float32])


# --------------------------------------------------------------------------------------------
# gradient accumulation over a few compiled calls


@pytest.mark.parametrize("opt", ["sgd_momentum", "adamw", "nadam"])
def test_gradient_accumulation(opt):
    kiln.reset()
    m, r, o1, o2 = _pair(CONFIGS[opt])

    def mk(model, o):
        def step(x, y, do_step):
            loss = _loss_fn(model(x), y) / 2
            loss.backward()
            if do_step:
                o.step()
                o.zero_grad()
            return loss
        return step

    c, e = kiln.compile(mk(m, o1)), mk(r, o2)
    for i, (x, y) in enumerate(_batches(6)):
        torch.testing.assert_close(c(x, y, i % 2 == 1), e(x, y, i % 2 == 1))
        _assert_same(m, r, o1, o2, TOL[torch.float32])


# --------------------------------------------------------------------------------------------
# swa_utils


def _swa_step(model, opt, avg):
    def step(x, y):
        loss = _loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        avg.update_parameters(model)
        return loss
    return step


@pytest.mark.parametrize("kind", ["swa", "ema", "ema_multi", "swa_buffers"])
def test_swa_utils_averaged_model(kind):
    from torch.optim import swa_utils
    kiln.reset()
    m, r, o1, o2 = _pair(CONFIGS["sgd_momentum"])

    def avg_of(model):
        if kind == "swa":
            return swa_utils.AveragedModel(model)
        if kind == "ema":
            return swa_utils.AveragedModel(model, avg_fn=swa_utils.get_ema_avg_fn(0.9))
        if kind == "ema_multi":
            return swa_utils.AveragedModel(model, multi_avg_fn=swa_utils.get_ema_multi_avg_fn(0.9))
        return swa_utils.AveragedModel(model, use_buffers=True)

    a1, a2 = avg_of(m), avg_of(r)
    c, e = kiln.compile(_swa_step(m, o1, a1)), _swa_step(r, o2, a2)
    for x, y in _batches(5):
        torch.testing.assert_close(c(x, y), e(x, y))
        _assert_same(m, r, o1, o2, TOL[torch.float32])
        torch.testing.assert_close(list(a1.parameters()), list(a2.parameters()), **TOL[torch.float32])
        assert int(a1.n_averaged) == int(a2.n_averaged)


def test_swa_update_compiled_alone_and_swalr():
    from torch.optim import swa_utils
    kiln.reset()
    m, r, o1, o2 = _pair(CONFIGS["sgd_momentum"])
    a1, a2 = swa_utils.AveragedModel(m), swa_utils.AveragedModel(r)
    sw1 = swa_utils.SWALR(o1, swa_lr=0.01, anneal_epochs=2)
    sw2 = swa_utils.SWALR(o2, swa_lr=0.01, anneal_epochs=2)
    upd = kiln.compile(lambda: a1.update_parameters(m))
    c, e = kiln.compile(_whole_step(m, o1)), _whole_step(r, o2)
    for x, y in _batches(5):
        torch.testing.assert_close(c(x, y), e(x, y))
        upd()
        a2.update_parameters(r)
        sw1.step(), sw2.step()
        _assert_same(m, r, o1, o2, TOL[torch.float32])
        torch.testing.assert_close(list(a1.parameters()), list(a2.parameters()), **TOL[torch.float32])


# --------------------------------------------------------------------------------------------
# state_dict / load_state_dict between compiled steps


@pytest.mark.parametrize("name", ["sgd_momentum", "adam_amsgrad", "adamw", "rmsprop_centered", "asgd"])
def test_load_state_dict_into_fresh_optimizer(name):
    """Two compiled steps, the optimizer's state saved and loaded into a new optimizer, which
    the same compiled step (taking the optimizer as an argument) drives on."""
    kiln.reset()
    make = CONFIGS[name]
    m, r, o1, o2 = _pair(make)

    def step(model, opt, x, y):
        loss = _loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    c = kiln.compile(step)
    for i, (x, y) in enumerate(_batches(6)):
        if i == 2:
            sd1, sd2 = copy.deepcopy(o1.state_dict()), copy.deepcopy(o2.state_dict())
            o1, o2 = make(m.parameters()), make(r.parameters())
            o1.load_state_dict(sd1)
            o2.load_state_dict(sd2)
        torch.testing.assert_close(c(m, o1, x, y), step(r, o2, x, y))
        _assert_same(m, r, o1, o2, TOL[torch.float32])


@pytest.mark.parametrize("name", ["sgd_momentum", "adam", "adamw_amsgrad", "nadam"])
def test_load_earlier_checkpoint_into_same_optimizer(name):
    """The optimizer (the global the compiled step reads) rewound to an earlier state_dict:
    its state tensors are new objects with older values."""
    kiln.reset()
    m, r, o1, o2 = _pair(CONFIGS[name])
    c, e = kiln.compile(_whole_step(m, o1)), _whole_step(r, o2)
    saved = None
    for i, (x, y) in enumerate(_batches(6)):
        if i == 1:
            saved = (copy.deepcopy(o1.state_dict()), copy.deepcopy(o2.state_dict()))
        if i == 4:
            o1.load_state_dict(saved[0])
            o2.load_state_dict(saved[1])
        torch.testing.assert_close(c(x, y), e(x, y))
        _assert_same(m, r, o1, o2, TOL[torch.float32])


def test_state_dict_round_trip_after_compiled_steps():
    kiln.reset()
    m, r, o1, o2 = _pair(CONFIGS["adamw_amsgrad"])
    c, e = kiln.compile(_whole_step(m, o1)), _whole_step(r, o2)
    for x, y in _batches(3):
        c(x, y), e(x, y)
    sd = o1.state_dict()
    # the step counts are CPU float tensors as eager keeps them, the steps taken 3
    for s in sd["state"].values():
        assert isinstance(s["step"], torch.Tensor) and s["step"].dtype == torch.float32 and float(s["step"]) == 3.0
    _assert_state_equal(o1, o2, TOL[torch.float32])


def test_state_cleared_between_compiled_steps():
    kiln.reset()
    m, r, o1, o2 = _pair(CONFIGS["adam"])
    c, e = kiln.compile(_whole_step(m, o1)), _whole_step(r, o2)
    for i, (x, y) in enumerate(_batches(5)):
        if i == 2:
            o1.state.clear()
            o2.state.clear()
        torch.testing.assert_close(c(x, y), e(x, y))
        _assert_same(m, r, o1, o2, TOL[torch.float32])


# --------------------------------------------------------------------------------------------
# LBFGS (a step taking a closure)


@pytest.mark.parametrize("line_search", [None, "strong_wolfe"])
def test_lbfgs_step_with_closure(line_search):
    kiln.reset()
    m, r, o1, o2 = _pair(lambda p: O.LBFGS(p, lr=0.5, max_iter=4, history_size=3, line_search_fn=line_search),
                         torch.float64)

    def mk(model, o):
        def train(x, y):
            def closure():
                o.zero_grad()
                loss = _loss_fn(model(x), y)
                loss.backward()
                return loss
            return o.step(closure)
        return train

    c, e = kiln.compile(mk(m, o1)), mk(r, o2)
    for x, y in _batches(3, torch.float64):
        torch.testing.assert_close(c(x, y), e(x, y), **TOL[torch.float64])
        torch.testing.assert_close(list(m.parameters()), list(r.parameters()), **TOL[torch.float64])


# --------------------------------------------------------------------------------------------
# other step-level behaviour


def test_step_hooks_run_once_per_compiled_step():
    kiln.reset()
    m, r, o1, o2 = _pair(CONFIGS["adam"])
    seen = []
    o1.register_step_pre_hook(lambda o, a, k: seen.append("pre"))
    o1.register_step_post_hook(lambda o, a, k: seen.append("post"))
    c, e = kiln.compile(_whole_step(m, o1)), _whole_step(r, o2)
    for x, y in _batches(3):
        torch.testing.assert_close(c(x, y), e(x, y))
    assert seen == ["pre", "post"] * 3
    _assert_same(m, r, o1, o2, TOL[torch.float32])


def test_step_returns_closure_loss():
    m = _model()
    opt = O.SGD(m.parameters(), lr=0.1)
    x, y = _batches(1)[0]

    def train():
        def closure():
            opt.zero_grad()
            loss = _loss_fn(m(x), y)
            loss.backward()
            return loss
        return opt.step(closure)

    r = copy.deepcopy(m)
    ropt = O.SGD(r.parameters(), lr=0.1)

    def rtrain():
        def closure():
            ropt.zero_grad()
            loss = _loss_fn(r(x), y)
            loss.backward()
            return loss
        return ropt.step(closure)

    c = kiln.compile(train)
    for _ in range(3):
        torch.testing.assert_close(c(), rtrain())
    torch.testing.assert_close(list(m.parameters()), list(r.parameters()))


def test_step_with_missing_grad_raises_nothing_and_skips():
    """Parameters whose .grad is None after backward (unused in the loss) are skipped."""
    kiln.reset()
    m, r, o1, o2 = _pair(CONFIGS["adam"])

    def mk(model, o):
        def step(x, y):
            loss = _loss_fn(model[0](x)[:, :3], y)  # model[2] unused: no gradients
            loss.backward()
            o.step()
            o.zero_grad()
            return loss
        return step

    c, e = kiln.compile(mk(m, o1)), mk(r, o2)
    for x, y in _batches(3):
        torch.testing.assert_close(c(x, y), e(x, y))
        _assert_same(m, r, o1, o2, TOL[torch.float32])


def test_sparse_grad_error_matches_eager():
    """Adam refuses a sparse gradient; the error type and message are eager's."""
    emb1 = torch.nn.Embedding(10, 3, sparse=True)
    o1 = O.Adam(emb1.parameters())

    def step(idx):
        emb1(idx).sum().backward()
        o1.step()

    idx = torch.tensor([1, 2, 3])
    with pytest.raises(RuntimeError) as eager_err:
        step(idx)
    emb1.zero_grad()
    with pytest.raises(RuntimeError) as kiln_err:
        kiln.compile(step)(idx)
    assert str(kiln_err.value) == str(eager_err.value)


def test_train_eval_toggle_with_dropout_free_model_and_optimizer():
    """model.train()/eval() toggled around compiled steps (eval forward between steps)."""
    kiln.reset()
    m, r, o1, o2 = _pair(CONFIGS["adamw"])
    c, e = kiln.compile(_whole_step(m, o1)), _whole_step(r, o2)
    cm = kiln.compile(m)
    for x, y in _batches(4):
        m.train(), r.train()
        torch.testing.assert_close(c(x, y), e(x, y))
        m.eval(), r.eval()
        with torch.no_grad():
            torch.testing.assert_close(cm(x), r(x), **TOL[torch.float32])
        _assert_same(m, r, o1, o2, TOL[torch.float32])


# --------------------------------------------------------------------------------------------
# the step alone, on unusual parameters and state changed between compiled steps (after
# test_optim.py's complex / mixed dtype / state tests)


def _params_default():
    return [torch.randn(4, 3), torch.randn(5)]


def _run_step_edge(make, params=_params_default, mutate=None, steps=5, expect_graph=True):
    kiln.reset()
    torch.manual_seed(0)
    ps = params()
    p1 = [torch.nn.Parameter(p.clone()) for p in ps]
    p2 = [torch.nn.Parameter(p.clone()) for p in ps]
    o1, o2 = make(p1), make(p2)
    compiled = kiln.compile(lambda: o1.step())
    g = torch.Generator().manual_seed(1)
    for i in range(steps):
        if mutate:
            mutate(i, p1, o1)
            mutate(i, p2, o2)
        for a, b in zip(p1, p2):
            gr = torch.randn(a.shape, generator=g, dtype=a.dtype)
            a.grad, b.grad = gr.clone(), gr.clone()
        compiled()
        o2.step()
        torch.testing.assert_close(p1, p2, rtol=1e-5, atol=1e-6)
        _assert_state_equal(o1, o2, dict(rtol=1e-5, atol=1e-6))
    st = kiln.stats()
    assert st["eager_fallbacks"] == 0, st["fallback_reasons"]
    if expect_graph:
        assert st["graphs_compiled"] >= 1, st["fallback_reasons"]
    return st


def _set_group(key, value, at=2):
    def mutate(i, ps, o):
        if i == at:
            for grp in o.param_groups:
                grp[key] = value
    return mutate


def _replace_step_count(i, ps, o):
    if i == 2:
        for s in o.state.values():
            s["step"] = torch.tensor(100.0)


def _fill_step_count(i, ps, o):
    if i == 2:
        for s in o.state.values():
            s["step"].fill_(100.0)


def _scale_exp_avg(i, ps, o):
    if i == 2:
        for s in o.state.values():
            s["exp_avg"].mul_(3)


def _drop_momentum_buffer(i, ps, o):
    if i == 2:
        for s in o.state.values():
            s["momentum_buffer"] = None


def _reverse_params(i, ps, o):
    if i == 2:
        o.param_groups[0]["params"] = list(reversed(o.param_groups[0]["params"]))


def _reassign_data(i, ps, o):
    if i == 2:
        torch.manual_seed(5)
        ps[0].data = torch.randn_like(ps[0])


def _reassign_data_new_shape(i, ps, o):
    if i == 2:
        torch.manual_seed(5)
        ps[0].data = torch.randn(2, 2)


def _params_inplace(i, ps, o):
    with torch.no_grad():
        ps[1].mul_(0.5)


EDGE = {
    "adam_fused_cpu": (lambda p: O.Adam(p, lr=0.01, fused=True), None, None),
    "adamw_fused_cpu_amsgrad": (lambda p: O.AdamW(p, lr=0.01, fused=True, amsgrad=True), None, None),
    "sgd_fused_cpu": (lambda p: O.SGD(p, lr=0.01, momentum=0.9, fused=True), None, None),
    "adam_tensor_betas": (lambda p: O.Adam(p, lr=torch.tensor(0.01), betas=(torch.tensor(0.8), torch.tensor(0.9)),
                                           foreach=False), None, None),
    "adam_mixed_dtypes": (lambda p: O.Adam(p, lr=0.1), lambda: [torch.randn(4, 3), torch.randn(5, dtype=torch.float64)], None),
    "sgd_mixed_dtypes": (lambda p: O.SGD(p, lr=0.1, momentum=0.9), lambda: [torch.randn(4, 3), torch.randn(5, dtype=torch.float64)], None),
    "adam_zero_size": (lambda p: O.Adam(p, lr=0.1), lambda: [torch.randn(0, 3), torch.randn(5)], None),
    "adam_noncontiguous": (lambda p: O.Adam(p, lr=0.1), lambda: [torch.randn(3, 4).t(), torch.randn(5)], None),
    "sgd_noncontiguous": (lambda p: O.SGD(p, lr=0.1, momentum=0.9), lambda: [torch.randn(3, 4).t(), torch.randn(5)], None),
    "adam_p_data_reassigned": (lambda p: O.Adam(p, lr=0.1), None, _reassign_data),
    "sgd_p_data_reassigned": (lambda p: O.SGD(p, lr=0.1, momentum=0.9), None, _reassign_data),
    "sgd_p_data_new_shape": (lambda p: O.SGD(p, lr=0.1), None, _reassign_data_new_shape),
    "adam_params_scaled_in_place": (lambda p: O.Adam(p, lr=0.1), None, _params_inplace),
    "sgd_lr_int": (lambda p: O.SGD(p, lr=1, momentum=0.9), None, None),
    "adam_params_reordered": (lambda p: O.Adam(p, lr=0.1), None, _reverse_params),
    "adam_step_count_replaced": (lambda p: O.Adam(p, lr=0.1), None, _replace_step_count),
    "adam_step_count_filled": (lambda p: O.Adam(p, lr=0.1), None, _fill_step_count),
    "adam_exp_avg_scaled": (lambda p: O.Adam(p, lr=0.1), None, _scale_exp_avg),
    "sgd_momentum_buffer_none": (lambda p: O.SGD(p, lr=0.1, momentum=0.9), None, _drop_momentum_buffer),
    "sgd_momentum_0_to_0.9": (lambda p: O.SGD(p, lr=0.1), None, _set_group("momentum", 0.9)),
    "adamw_wd_0_to_0.5": (lambda p: O.AdamW(p, lr=0.1, weight_decay=0.0), None, _set_group("weight_decay", 0.5)),
    "adam_maximize_on": (lambda p: O.Adam(p, lr=0.1), None, _set_group("maximize", True)),
}


@pytest.mark.parametrize("name", sorted(EDGE))
def test_step_edge_cases(name):
    make, params, mutate = EDGE[name]
    _run_step_edge(make, params or _params_default, mutate)


@pytest.mark.xfail(strict=True, reason="complex parameters: kiln makes no graph of the step (input dtype "
                                      "ComplexFloat) where TorchDynamo captures one")
@pytest.mark.parametrize("name", ["sgd", "adam", "adamw"])
def test_step_complex_params(name):
    make = {"sgd": lambda p: O.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.1),
            "adam": lambda p: O.Adam(p, lr=0.1, amsgrad=True), "adamw": lambda p: O.AdamW(p, lr=0.1)}[name]
    # values equal eager's even so (the step runs eagerly)
    _run_step_edge(make, lambda: [torch.randn(4, 3, dtype=torch.complex64), torch.randn(5)], expect_graph=False)
    p = torch.nn.Parameter(torch.randn(3, dtype=torch.complex64))
    opt = make([p])
    p.grad = torch.randn_like(p)
    opt.step()

    def step():
        opt.step()

    torch._dynamo.reset()
    theirs = torch._dynamo.explain(step)()
    mine = kiln.explain(step)()
    assert mine.graph_count >= theirs.graph_count == 1, mine.break_reasons


def test_capturable_on_cpu_behaves_as_torch_compile():
    """Adam(capturable=True) with CPU parameters: eager asserts the device, torch's optimizer skips
    the check under compilation (torch.compiler.is_compiling()), so torch.compile and kiln both
    take the step."""
    results = []
    for which in ("kiln", "dynamo"):
        torch._dynamo.reset()
        p = torch.nn.Parameter(torch.ones(3))
        opt = O.Adam([p], lr=0.1, capturable=True)
        p.grad = torch.ones(3)
        fn = (kiln.compile if which == "kiln" else lambda f: torch.compile(f, backend="eager"))(lambda: opt.step())
        fn()
        results.append(p.detach().clone())
    torch.testing.assert_close(results[0], results[1])
    p = torch.nn.Parameter(torch.ones(3))
    opt = O.Adam([p], lr=0.1, capturable=True)
    p.grad = torch.ones(3)
    with pytest.raises(AssertionError):
        opt.step()


def test_differentiable_optimizer_error_matches_eager():
    p1 = torch.nn.Parameter(torch.ones(3))
    o1 = O.Adam([p1], lr=0.1, differentiable=True)
    p1.grad = torch.ones(3)
    with pytest.raises(RuntimeError) as eager_err:
        o1.step()
    p2 = torch.nn.Parameter(torch.ones(3))
    o2 = O.Adam([p2], lr=0.1, differentiable=True)
    p2.grad = torch.ones(3)
    with pytest.raises(RuntimeError) as kiln_err:
        kiln.compile(lambda: o2.step())()
    assert str(kiln_err.value) == str(eager_err.value)
    torch.testing.assert_close(p1, p2)


def test_tensor_lr_with_foreach_error_matches_eager():
    p = torch.nn.Parameter(torch.ones(3))
    with pytest.raises(ValueError) as eager_err:
        O.Adam([p], lr=torch.tensor(0.1), foreach=True)
    with pytest.raises(ValueError) as kiln_err:
        kiln.compile(lambda: O.Adam([p], lr=torch.tensor(0.1), foreach=True))()
    assert str(kiln_err.value) == str(eager_err.value)


# --------------------------------------------------------------------------------------------
# more whole-step shapes: two updates in one call, the state read back, schedules written
# inside the compiled function, and other code around the step


def _compare_fn(factory, make, steps=4, equal_nan=False):
    kiln.reset()
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 3)
    r = copy.deepcopy(m)
    o1, o2 = make(m.parameters()), make(r.parameters())
    c, e = kiln.compile(factory(m, o1)), factory(r, o2)
    g = torch.Generator().manual_seed(2)
    for _ in range(steps):
        x = torch.randn(2, 4, generator=g)
        torch.testing.assert_close(c(x), e(x), rtol=1e-5, atol=1e-6, equal_nan=equal_nan)
        torch.testing.assert_close(list(m.parameters()), list(r.parameters()), rtol=1e-5, atol=1e-6,
                                   equal_nan=equal_nan)
        assert len(o1.state) == len(o2.state)
        torch.testing.assert_close(o1.state_dict()["state"], o2.state_dict()["state"], rtol=1e-5, atol=1e-6,
                                   equal_nan=equal_nan)
    return m, o1


def _two_steps(m, o):
    def f(x):
        m(x).square().mean().backward()
        o.step()
        o.step()
        o.zero_grad()
    return f


@pytest.mark.parametrize("name", ["adam", "adamw_amsgrad", "sgd_momentum", "sgd_weight_decay_maximize", "rmsprop"])
def test_two_steps_in_one_compiled_call(name):
    _compare_fn(_two_steps, CONFIGS[name])


def _read_state_after_step(key):
    def factory(m, o):
        def f(x):
            m(x).square().mean().backward()
            o.step()
            o.zero_grad()
            return o.state[m.weight][key] * 1
        return f
    return factory


XFAIL_STEP_READ = pytest.mark.xfail(strict=True, reason=(
    "Adam's step count is incremented on the host after the graph: a read of state['step'] in the "
    "same call, after the step, sees the count before it"))


@pytest.mark.parametrize("name,key", [pytest.param("adam", "step", marks=XFAIL_STEP_READ), ("adam", "exp_avg"),
                                      ("sgd_momentum", "momentum_buffer"), ("adamw_amsgrad", "max_exp_avg_sq")])
def test_read_optimizer_state_after_compiled_step(name, key):
    _compare_fn(_read_state_after_step(key), CONFIGS[name])


def test_read_optimizer_state_leaves_state_dict_alone():
    p = torch.nn.Parameter(torch.ones(3))
    opt = O.Adam([p], lr=0.1)
    p.grad = torch.ones(3)
    opt.step()
    out = kiln.compile(lambda: opt.state[p]["exp_avg"] * 1)()
    torch.testing.assert_close(out, opt.state[p]["exp_avg"])
    assert len(opt.state) == 1 and list(opt.state_dict()["state"]) == [0]


XFAIL_DICT_FLOAT = pytest.mark.xfail(strict=True, reason=(
    "a float in a dict (param_groups[0]['lr']) changed inside the compiled function is guarded "
    "by value (EQUALS_MATCH): every call recompiles, TorchDynamo compiles twice"))


@XFAIL_DICT_FLOAT
def test_lr_decayed_inside_compiled_function_recompiles_vs_dynamo():
    def factory(m, o):
        def f(x):
            m(x).square().mean().backward()
            o.step()
            o.zero_grad()
            o.param_groups[0]["lr"] *= 0.7
            return torch.tensor(o.param_groups[0]["lr"])
        return f
    _compare_fn(factory, CONFIGS["sgd_momentum"], steps=6)
    mine = kiln.stats()["graphs_compiled"]
    torch._dynamo.reset()
    cnt = _Counter()
    m = torch.nn.Linear(4, 3)
    fn = torch.compile(factory(m, CONFIGS["sgd_momentum"](m.parameters())), backend=cnt)
    for _ in range(6):
        fn(torch.randn(2, 4))
    assert mine <= cnt.frames, (mine, cnt.frames)


def test_lr_decayed_inside_compiled_function_values():
    def factory(m, o):
        def f(x):
            m(x).square().mean().backward()
            o.step()
            o.zero_grad()
            o.param_groups[0]["lr"] *= 0.7
            return torch.tensor(o.param_groups[0]["lr"])
        return f
    _compare_fn(factory, CONFIGS["adamw"], steps=6)


def _grad_read_after_step(m, o):
    def f(x):
        m(x).square().mean().backward()
        g = m.weight.grad
        o.step()
        out = g * 1
        o.zero_grad()
        return out, m.weight * 1
    return f


def _param_view_across_step(m, o):
    def f(x):
        w0 = m.weight[0]
        m(x).square().mean().backward()
        o.step()
        o.zero_grad()
        return w0 * 1
    return f


def _clone_before_after(m, o):
    def f(x):
        m(x).square().mean().backward()
        before = m.weight.detach().clone()
        o.step()
        o.zero_grad()
        return before, m.weight.detach().clone()
    return f


def _step_under(ctx):
    def factory(m, o):
        def f(x):
            loss = m(x).square().mean()
            loss.backward()
            with ctx():
                o.step()
            o.zero_grad()
            return loss
        return f
    return factory


def _l2_in_loss(m, o):
    def f(x):
        loss = m(x).square().mean() + 0.01 * sum(p.square().sum() for p in m.parameters())
        loss.backward()
        o.step()
        o.zero_grad()
        return loss
    return f


def _tied(m, o):
    def f(x):
        y = F.linear(x @ (m.weight.T @ m.weight), m.weight, m.bias)
        y.square().mean().backward()
        o.step()
        o.zero_grad()
        return y
    return f


def _two_optimizers(m, o):
    other = O.SGD([m.bias], lr=0.5, momentum=0.5)

    def f(x):
        m(x).square().mean().backward()
        o.step()
        other.step()
        o.zero_grad()
        other.zero_grad()
    return f


def _inf_grads_clipped(m, o):
    def f(x):
        (m(x).square().mean() * float("inf")).backward()
        n = torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        o.step()
        o.zero_grad()
        return n
    return f


def _plateau_inside(m, o):
    s = LS.ReduceLROnPlateau(o, factor=0.5, patience=0, threshold=10.0)

    def f(x):
        loss = m(x).square().mean()
        loss.backward()
        o.step()
        o.zero_grad()
        s.step(loss)
        return loss
    return f


def _sequential_inside(m, o):
    s = SCHEDULERS["SequentialLR"](o)

    def f(x):
        loss = m(x).square().mean()
        loss.backward()
        o.step()
        o.zero_grad()
        s.step()
        return loss
    return f


AROUND = {
    "grad_read_after_step_adam": (_grad_read_after_step, "adam"),
    "param_view_across_step_sgd": (_param_view_across_step, "sgd_momentum"),
    "param_view_across_step_adam": (_param_view_across_step, "adam"),
    "clone_before_after_adamw": (_clone_before_after, "adamw"),
    "clone_before_after_sgd": (_clone_before_after, "sgd_nesterov"),
    "step_under_no_grad": (_step_under(torch.no_grad), "adam"),
    "step_under_enable_grad": (_step_under(torch.enable_grad), "sgd_momentum"),
    "step_under_autocast": (_step_under(lambda: torch.autocast("cpu", dtype=torch.bfloat16)), "adamw"),
    "l2_in_loss_sgd": (_l2_in_loss, "sgd_momentum"),
    "l2_in_loss_rmsprop": (_l2_in_loss, "rmsprop"),
    "tied_weight_adam": (_tied, "adam_amsgrad"),
    "two_optimizers_same_model": (_two_optimizers, "adam"),
    "plateau_step_inside": (_plateau_inside, "adamw"),
    "sequential_lr_inside": (_sequential_inside, "sgd_momentum"),
}


@pytest.mark.parametrize("name", sorted(AROUND))
def test_code_around_the_step(name):
    factory, opt = AROUND[name]
    _compare_fn(factory, CONFIGS[opt])


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_inf_gradients_clipped_give_nan_as_eager(opt):
    _compare_fn(_inf_grads_clipped, CONFIGS[opt], steps=2, equal_nan=True)


def test_clip_error_if_nonfinite_raises_as_eager():
    def factory(m, o):
        def f(x):
            (m(x).square().mean() * float("inf")).backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0, error_if_nonfinite=True)
            o.step()
        return f
    m = torch.nn.Linear(4, 3)
    r = copy.deepcopy(m)
    x = torch.randn(2, 4)
    with pytest.raises(RuntimeError) as eager_err:
        factory(r, O.SGD(r.parameters(), lr=0.1))(x)
    with pytest.raises(RuntimeError) as kiln_err:
        kiln.compile(factory(m, O.SGD(m.parameters(), lr=0.1)))(x)
    assert str(kiln_err.value) == str(eager_err.value)
    torch.testing.assert_close(list(m.parameters()), list(r.parameters()))
