"""Data parallel training on torch's own engine (issue 13): a kiln-compiled module inside
DistributedDataParallel, and FSDP2 (`fully_shard`) over blocks whose forward kiln compiles,
each in 2 processes, train as single-process eager training does.

gloo on the CPU (CI); NCCL on 2 GPUs where the machine has them (marked `gpu`). DDP's gradient
hooks fire per parameter, as in eager, when kiln's backward nodes hand autograd the gradients:
inside DDP the backward is cut at DDP's bucket boundaries, a node per stage, so one bucket's
all-reduce runs while the next stage computes. FSDP2's hooks (all-gather before a block's
forward, reduce-scatter after its backward) run in Python around the compiled forward and
backward.
"""
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

WORLD = 2
BACKENDS = ["gloo", pytest.param("nccl", marks=[pytest.mark.gpu, pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")])]


class Block(torch.nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(Block(), Block(), torch.nn.Linear(16, 4))


def _batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(3)]


def _worker(rank, backend, init, wrap, q):
    try:
        import kiln
        device = f"cuda:{rank}" if backend == "nccl" else "cpu"
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=init, rank=rank, world_size=WORLD)
        model = _model().to(device)
        run = wrap(model, device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        losses = []
        for x, y in _batches():
            x, y = x.chunk(WORLD)[rank].to(device), y.chunk(WORLD)[rank].to(device)
            loss = F.cross_entropy(run(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            losses.append(mean.item() / WORLD)
        params = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
        params = [p.detach().cpu().numpy().copy() for p in params]
        s = kiln.stats()
        q.put((rank, losses, params, s["backward_graphs_compiled"], s["eager_fallbacks"], dict(s["fallback_reasons"])))
        dist.destroy_process_group()
    except BaseException as e:  # the parent reports it
        q.put((rank, repr(e)))
        raise


def _ddp(model, device):
    import kiln
    ids = [int(device.split(":")[1])] if device.startswith("cuda") else None
    return torch.nn.parallel.DistributedDataParallel(kiln.compile(model), device_ids=ids)


# Buckets of about 4 KB: the model's 17 KB of parameters in several, so the backward in stages.
SMALL_BUCKETS_MB = 4096 / 2**20


def _compiled_ddp(model, device):
    # torch.compile's way round: the DDP module compiled (its forward runs as torch's, the module
    # it wraps through kiln)
    import kiln
    ids = [int(device.split(":")[1])] if device.startswith("cuda") else None
    return kiln.compile(torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=SMALL_BUCKETS_MB))


def _fsdp2(model, device):
    import kiln
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    # The mesh on the model's device type: left to itself, FSDP2 takes CUDA's wherever a GPU is
    # present, also for a CPU model over gloo.
    mesh = init_device_mesh(device.split(":")[0], (WORLD,))
    for block in model[:2]:
        fully_shard(block, mesh=mesh)
        block.forward = kiln.compile(block.forward)  # FSDP2's hooks stay around the compiled forward
    fully_shard(model, mesh=mesh)
    return model


def _train_in_processes(backend, wrap, compiled_blocks):
    init = "file://" + tempfile.mktemp(prefix="kiln-dist-")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, backend, init, wrap, q)) for r in range(WORLD)]
    for p in procs:
        p.start()
    results = [q.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    for r in results:
        assert len(r) > 2, f"rank {r[0]} failed: {r[1]}"
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    want = []
    for x, y in _batches():
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        want.append(loss.item())
    for rank, losses, params, backward_graphs, fallbacks, reasons in results:
        assert backward_graphs == compiled_blocks and fallbacks == 0, reasons
        torch.testing.assert_close(losses, want, rtol=1e-5, atol=1e-6)
        for got, ref in zip(params, model.parameters()):
            torch.testing.assert_close(torch.from_numpy(got), ref.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ddp_over_a_compiled_module_trains_like_one_process(backend):
    _train_in_processes(backend, _ddp, compiled_blocks=1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_ddp_module_with_its_backward_in_bucket_stages_trains_like_one_process(backend):
    _train_in_processes(backend, _compiled_ddp, compiled_blocks=1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fsdp2_with_compiled_blocks_trains_like_one_process(backend):
    _train_in_processes(backend, _fsdp2, compiled_blocks=2)


@pytest.fixture
def one_process_group(tmp_path):
    # A process group of one (gloo): DDP's reducer, buckets and hooks run as with more ranks.
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _stage_nodes(loss):
    nodes, seen, work = [], set(), [loss.grad_fn]
    while work:
        n = work.pop()
        if n is None or n in seen:
            continue
        seen.add(n)
        if n.name() == "CompiledFunctionBackward":
            nodes.append(n)
        work.extend(f for f, _ in n.next_functions)
    return nodes


def test_backward_in_bucket_stages_accumulates_a_bucket_before_the_next_stage_runs(one_process_group):
    import kiln
    fallbacks = kiln.stats()["eager_fallbacks"]  # the counters are the process's: earlier tests add to them
    model, ref = _model(), _model()
    compiled = kiln.compile(torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=SMALL_BUCKETS_MB))
    events = []
    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(lambda p, name=name: events.append(name))
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    loss = F.cross_entropy(compiled(x), y)
    stages = _stage_nodes(loss)
    assert len(stages) >= 3, "the backward was not cut at DDP's buckets"
    first = loss.grad_fn.next_functions[0][0].next_functions[0][0]
    assert first.name() == "CompiledFunctionBackward"
    for n in stages:
        n.register_prehook(lambda grads, n=n: events.append(n))
    loss.backward()
    # The last Linear's gradients reach their parameters (and DDP's hooks) before the last stage
    # runs, the first block's after the second stage began; each stage runs once, the first first.
    ran = [e for e in events if not isinstance(e, str)]
    assert len(ran) == len(stages) and ran[0] is first
    assert events.index("2.weight") < events.index(ran[1])
    assert events.index("0.fc1.weight") > events.index(ran[1])
    ref_loss = F.cross_entropy(ref(x), y)
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss)
    for (name, a), b in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name)
    assert kiln.stats()["eager_fallbacks"] == fallbacks
    # the model DDP wraps is what kiln compiled, and explain shows it; the model is as it was
    assert "forward" not in model.__dict__
    assert kiln.explain(compiled)(x).graph_count == 1


def test_backward_in_stages_keeps_autograd_semantics(one_process_group):
    # retain_graph, torch.autograd.grad of one parameter, an input that requires grad, an output
    # autograd does not reach, and create_graph's error, through a backward of several stages
    import kiln

    class TwoHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(Block(), Block())
            self.head, self.aux = torch.nn.Linear(16, 4), torch.nn.Linear(16, 2)

        def forward(self, x):
            h = self.body(x)
            return self.head(h), self.aux(h)

    torch.manual_seed(0)
    model = TwoHeads()
    ref = TwoHeads()
    ref.load_state_dict(model.state_dict())
    compiled = kiln.compile(torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=SMALL_BUCKETS_MB))
    x = torch.randn(8, 16, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    out, aux = compiled(x)
    ref_out, ref_aux = ref(xr)
    assert len(_stage_nodes(out.sum())) >= 3
    w = model.body[0].fc1.weight
    (gw,) = torch.autograd.grad(out.pow(2).sum(), [w], retain_graph=True)
    (rw,) = torch.autograd.grad(ref_out.pow(2).sum(), [ref.body[0].fc1.weight], retain_graph=True)
    torch.testing.assert_close(gw, rw)
    # autograd reaches no output the aux head's gradient flows from: None, as eager's
    got = torch.autograd.grad(out.sum(), [model.aux.weight, w], allow_unused=True, retain_graph=True)
    want = torch.autograd.grad(ref_out.sum(), [ref.aux.weight, ref.body[0].fc1.weight], allow_unused=True,
                               retain_graph=True)
    assert got[0] is None and want[0] is None
    torch.testing.assert_close(got[1], want[1])
    # the same graph again, through every stage
    out.sum().backward()
    ref_out.sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)
    for a, b in zip(model.body.parameters(), ref.body.parameters()):
        torch.testing.assert_close(a.grad, b.grad)
    out2, _ = compiled(x)
    (g,) = torch.autograd.grad(out2.sum(), [x], create_graph=True)
    with pytest.raises(RuntimeError, match="double backward through a kiln-compiled graph"):
        g.sum().backward()


def test_backward_in_stages_with_shape_generic_graphs(one_process_group):
    # dynamic=True: one graph for every batch size; the stages' handed-over values have symbolic
    # sizes, told to autograd when the stage before runs
    import kiln
    model, ref = _model(), _model()
    compiled = kiln.compile(torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=SMALL_BUCKETS_MB),
                            dynamic=True)
    before = kiln.stats()["graphs_compiled"]
    for n in (8, 12, 5, 9):
        x, y = torch.randn(n, 7, 16), torch.randint(0, 4, (n * 7,))
        loss = F.cross_entropy(compiled(x).flatten(0, 1), y)
        assert len(_stage_nodes(loss)) >= 3
        loss.backward()
        ref_loss = F.cross_entropy(ref(x).flatten(0, 1), y)
        ref_loss.backward()
        torch.testing.assert_close(loss, ref_loss)
        for a, b in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)
        model.zero_grad()
        ref.zero_grad()
    assert kiln.stats()["graphs_compiled"] == before + 1
