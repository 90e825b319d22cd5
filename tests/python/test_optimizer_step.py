"""Training steps whose optimizer step kiln compiles: ``opt.step()`` of torch.optim's SGD, Adam
and AdamW and ``opt.zero_grad()`` inside a compiled function, against the same step run
eagerly (torch's foreach implementation). Learning-rate schedulers change the rate every step
without a recompile."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import kiln

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])]


def _model(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.GELU(), torch.nn.LayerNorm(24),
                               torch.nn.Linear(24, 5)).to(device)


def _batches(n, device):
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(6, 12, generator=g).to(device), torch.randint(0, 5, (6,), generator=g).to(device)) for _ in range(n)]


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05),
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "sgd_nesterov_wd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True, weight_decay=1e-2),
    "sgd_dampening_maximize": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.5, dampening=0.3, maximize=True),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adam_wd_amsgrad": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1, amsgrad=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2),
    "adamw_betas_maximize": lambda p: torch.optim.AdamW(p, lr=1e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.05, maximize=True),
}


def _run(make_opt, device, compiled, steps=5, scheduler=None, zero_first=False):
    model = _model(device)
    opt = make_opt(model.parameters())
    sched = scheduler(opt) if scheduler else None

    def step(x, y):
        if zero_first:
            opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if not zero_first:
            opt.zero_grad()
        return loss

    run = kiln.compile(step) if compiled else step
    losses = []
    for x, y in _batches(steps, device):
        losses.append(run(x, y).item())
        if sched:
            sched.step()
    return losses, model, opt


def _state_tensors(opt):
    return [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_compiled_step_equals_eager(name, device):
    kiln.reset()
    mine = _run(OPTIMIZERS[name], device, compiled=True)
    stats = kiln.stats()
    theirs = _run(OPTIMIZERS[name], device, compiled=False)
    torch.testing.assert_close(mine[0], theirs[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(list(mine[1].parameters()), list(theirs[1].parameters()), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(_state_tensors(mine[2]), _state_tensors(theirs[2]), rtol=1e-5, atol=1e-6)
    # zero_grad(set_to_none=True) left no gradient behind
    assert all(p.grad is None for p in mine[1].parameters())
    # forward + backward is one graph, the step and zero_grad another (the break is backward()),
    # and nothing ran eagerly
    assert stats["graphs_compiled"] == 2, stats
    # SGD's first step with dampening makes its momentum buffers eagerly (the call runs in
    # Python, on the GPU as one eager call); the next compiles
    first_step_eager = "dampening" in name
    assert stats["eager_fallbacks"] <= (1 if first_step_eager else 0), stats["fallback_reasons"]
    # (frames of other code that ran inside the eager step, torch's own, are not counted)
    ours = [r for r in stats["recompile_reasons"] if "_run.<locals>" in r]
    assert len(ours) == (1 if first_step_eager else 0), stats["recompile_reasons"]


SCHEDULERS = {
    "step_lr": lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7),
    "cosine": lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4),
    # OneCycleLR cycles Adam's beta1 (as momentum) with the rate
    "one_cycle": lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=10),
}


@pytest.mark.parametrize("sched", sorted(SCHEDULERS))
def test_lr_schedulers_change_the_rate_without_recompiling(sched):
    kiln.reset()
    make = OPTIMIZERS["adamw"]
    mine = _run(make, "cpu", compiled=True, steps=6, scheduler=SCHEDULERS[sched])
    stats = kiln.stats()
    theirs = _run(make, "cpu", compiled=False, steps=6, scheduler=SCHEDULERS[sched])
    torch.testing.assert_close(mine[0], theirs[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(list(mine[1].parameters()), list(theirs[1].parameters()), rtol=1e-5, atol=1e-6)
    assert stats["recompiles"] == 0, stats["recompile_reasons"]
    assert stats["graphs_compiled"] == 2 and stats["eager_fallbacks"] == 0, stats


def test_zero_grad_first_and_set_to_none_false():
    kiln.reset()
    mine = _run(OPTIMIZERS["sgd_momentum"], "cpu", compiled=True, zero_first=True)
    theirs = _run(OPTIMIZERS["sgd_momentum"], "cpu", compiled=False, zero_first=True)
    torch.testing.assert_close(list(mine[1].parameters()), list(theirs[1].parameters()), rtol=1e-5, atol=1e-6)

    model = _model("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = []
    for p in model.parameters():
        p.grad = torch.randn_like(p)
        grads.append(p.grad)

    @kiln.compile
    def clear():
        opt.zero_grad(set_to_none=False)

    clear()
    # zeroed in place: the same tensors, now zeros
    assert all(p.grad is g for p, g in zip(model.parameters(), grads))
    assert all(bool((g == 0).all()) for g in grads)


def test_parameters_without_grad_are_skipped_and_guarded():
    model = _model("cpu")
    ref = copy.deepcopy(model)
    opts = [torch.optim.Adam(m.parameters(), lr=0.01) for m in (model, ref)]

    def step(m, opt, x):
        m(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    run = kiln.compile(step)
    x = torch.randn(3, 12)
    for frozen in (False, True, False):
        for m in (model, ref):
            m[0].weight.requires_grad_(not frozen)
        run(model, opts[0], x)
        step(ref, opts[1], x)
        torch.testing.assert_close(list(model.parameters()), list(ref.parameters()), rtol=1e-5, atol=1e-6)


def test_explain_shows_the_step_as_a_graph():
    model = _model("cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(x, y):
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    x, y = _batches(1, "cpu")[0]
    text = str(kiln.explain(step)(x, y))
    assert "Graph Count: 2" in text and "Graph Break Count: 1" in text, text


def test_an_optimizer_with_step_hooks_runs_its_step_eagerly():
    kiln.reset()
    model = _model("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    opt.register_step_post_hook(lambda o, a, k: seen.append(1))

    @kiln.compile
    def step(x):
        model(x).sum().backward()
        opt.step()

    step(torch.randn(2, 12))
    assert seen == [1]
    assert any("hooks" in r for r in kiln.stats()["fallback_reasons"]), kiln.stats()["fallback_reasons"]


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_gradient_clipping_over_model_parameters_is_in_the_step_graph(norm_type):
    # clip_grad_norm_(model.parameters(), ...): the gradients' norm and scaling in the same graph
    # as the optimizer's update
    kiln.reset()

    def step(m, opt, x, y):
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.05, norm_type=norm_type)
        opt.step()
        opt.zero_grad()
        return loss, norm

    model = _model("cpu")
    ref = copy.deepcopy(model)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, ref)]
    run = kiln.compile(step)
    for x, y in _batches(3, "cpu"):
        torch.testing.assert_close(run(model, opts[0], x, y), step(ref, opts[1], x, y), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(list(model.parameters()), list(ref.parameters()), rtol=1e-5, atol=1e-6)
    stats = kiln.stats()
    assert stats["graphs_compiled"] == 2 and stats["eager_fallbacks"] == 0, stats["fallback_reasons"]


def test_a_caller_generator_is_not_used_up_by_capture():
    def total(xs, w):
        items = list(xs)  # a generator of the caller's: list() runs in Python
        return sum(t * w for t in items)

    w = torch.randn(3)
    ts = [torch.randn(3) for _ in range(3)]
    got = kiln.compile(total)((t for t in ts), w)
    torch.testing.assert_close(got, total((t for t in ts), w))


def test_a_whole_step_with_a_grad_scaler_trains_like_eager_and_keeps_the_scaler_real():
    # GradScaler.scale makes its scale tensor on first use: run as a torch call, its layout probe
    # on meta tensors left a meta tensor in the scaler. Its methods are inlined like a user's.
    def step(m, opt, scaler, x, y):
        loss = F.cross_entropy(m(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        return loss

    model = _model("cpu")
    ref = copy.deepcopy(model)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (model, ref)]
    scalers = [torch.amp.GradScaler("cpu", init_scale=1024.0) for _ in range(2)]
    run = kiln.compile(step)
    for x, y in _batches(4, "cpu"):
        torch.testing.assert_close(run(model, opts[0], scalers[0], x, y), step(ref, opts[1], scalers[1], x, y))
    assert scalers[0]._scale.device.type == "cpu" and scalers[0].get_scale() == scalers[1].get_scale()
    torch.testing.assert_close(list(model.parameters()), list(ref.parameters()), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_param_groups_with_their_own_settings(opt_name):
    kiln.reset()

    def make(m):
        groups = [{"params": [m[0].weight, m[0].bias], "lr": 0.02, "weight_decay": 0.0},
                  {"params": list(m[2].parameters()) + list(m[3].parameters()), "lr": 0.005, "weight_decay": 0.1}]
        if opt_name == "sgd":
            return torch.optim.SGD(groups, lr=0.01, momentum=0.9, nesterov=True)
        return torch.optim.AdamW(groups, lr=0.01, betas=(0.85, 0.99))

    def step(m, opt, x, y):
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    model = _model("cpu")
    ref = copy.deepcopy(model)
    opts = [make(model), make(ref)]
    run = kiln.compile(step)
    for i, (x, y) in enumerate(_batches(4, "cpu")):
        torch.testing.assert_close(run(model, opts[0], x, y), step(ref, opts[1], x, y), rtol=1e-5, atol=1e-6)
        for o in opts:  # a schedule of one's own, group by group
            o.param_groups[1]["lr"] *= 0.5
    torch.testing.assert_close(list(model.parameters()), list(ref.parameters()), rtol=1e-5, atol=1e-6)
    stats = kiln.stats()
    assert stats["recompiles"] == 0 and stats["eager_fallbacks"] == 0, stats["recompile_reasons"]


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_accumulation_keeps_a_few_entries(device):
    # `if (i + 1) % accum == 0: opt.step()`: the step counter becomes a size symbol after it
    # changes, the branch a guard on (s0 + 1) % 4, so neither the step nor its resume function
    # recompiles per value of i (it ran eagerly after 8 entries before).
    accum = 4

    def train(compiled):
        model = _model(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

        def step(x, y, i):
            loss = F.cross_entropy(model(x), y) / accum
            loss.backward()
            if (i + 1) % accum == 0:
                opt.step()
                opt.zero_grad()
            return loss.detach()

        run = kiln.compile(step) if compiled else step
        losses = [run(x, y, i).item() for i, (x, y) in enumerate(_batches(14, device))]
        return losses, model

    kiln.reset()
    eager_losses, eager_model = train(False)
    losses, model = train(True)
    torch.testing.assert_close(losses, eager_losses, rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    s = kiln.stats()
    assert s["eager_fallbacks"] == 0, s["fallback_reasons"]
    assert s["graphs_compiled"] <= 8, s["recompile_reasons"]


@pytest.mark.parametrize("name", ["SGD", "SGD_momentum", "Adam", "AdamW"])
def test_float64_steps_keep_float64_hyperparameters(name):
    """-lr, the bias corrections and the other arithmetic on Python numbers stay doubles: a
    float32 -lr put a float64 SGD step 9e-9 off eager's."""
    make = {
        "SGD": lambda ps: torch.optim.SGD(ps, lr=0.1),
        "SGD_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
        "Adam": lambda ps: torch.optim.Adam(ps, lr=0.1),
        "AdamW": lambda ps: torch.optim.AdamW(ps, lr=0.1, weight_decay=0.1),
    }[name]
    mine = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    theirs = mine.detach().clone().requires_grad_()
    opt_m, opt_t = make([mine]), make([theirs])

    def step(p, opt, g):
        p.grad = g.clone()
        opt.step()
        opt.zero_grad()

    compiled = kiln.compile(step)
    for i in range(4):
        g = torch.randn(3, dtype=torch.float64)
        compiled(mine, opt_m, g)
        step(theirs, opt_t, g)
    torch.testing.assert_close(mine, theirs, rtol=1e-14, atol=1e-15)


def test_sgd_without_momentum_leaves_the_state_empty():
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=0.1)

    def step():
        (p * 2).sum().backward()
        opt.step()
        opt.zero_grad()

    compiled = kiln.compile(step)
    for _ in range(3):
        compiled()
    assert opt.state_dict()["state"] == {}
    torch.testing.assert_close(p.detach(), torch.full((3,), 0.4))


def test_grad_scaler_step_function_equals_eager_with_an_overflow():
    """A step with GradScaler: scale, backward, step, update. Its per-optimizer state is a
    defaultdict of the caller's whose missing key inserts (captured, put back after the graph);
    an inf in one step skips it and halves the scale, as eager."""
    def make():
        torch.manual_seed(0)
        m = torch.nn.Linear(8, 4)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=2)

        def step(x, y):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = torch.nn.functional.mse_loss(m(x).float(), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            return loss
        return m, scaler, step

    (m1, s1, eager), (m2, s2, step) = make(), make()
    compiled = kiln.compile(step)
    for i in range(5):
        x, y = torch.randn(16, 8), torch.randn(16, 4)
        if i == 2:
            x[0, 0] = float("inf")
        torch.testing.assert_close(compiled(x, y), eager(x, y))
        assert s1.get_scale() == s2.get_scale()
        torch.testing.assert_close(m2.weight, m1.weight)
    reasons = " ".join(r["reason"] for r in kiln.explain(step)(x, y).break_reasons)
    assert "defaultdict" not in reasons and "convert()" not in reasons, reasons


@pytest.mark.parametrize("name", ["Adam", "AdamW"])
@pytest.mark.parametrize("warm", [False, True])
def test_two_steps_in_one_call_count_two(name, warm):
    def make():
        torch.manual_seed(0)
        p = torch.nn.Parameter(torch.randn(5))
        opt = getattr(torch.optim, name)([p], lr=0.1)
        p.grad = torch.randn(5)
        if warm:
            opt.step()
        return p, opt

    p, opt = make()
    q, ref = make()
    f = kiln.compile(lambda: (opt.step(), opt.step()))
    for _ in range(2):
        f()
        ref.step()
        ref.step()
    torch.testing.assert_close(p, q)
    assert opt.state[p]["step"].item() == ref.state[q]["step"].item()


def test_the_callers_optimizer_state_is_looked_up_by_parameter():
    from collections import defaultdict

    p, q = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    state = defaultdict(dict)
    state[p]["x"] = torch.full((3,), 2.0)
    read = kiln.compile(lambda: state[p]["x"] * 3)
    for _ in range(2):
        torch.testing.assert_close(read(), torch.full((3,), 6.0))
    assert list(state) == [p]
    assert kiln.compile(lambda: state[q])() == {}  # a missing key: the parameter itself inserted
    assert list(state) == [p, q]
