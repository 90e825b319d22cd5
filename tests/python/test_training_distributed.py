"""Data parallel training on torch's own engine (issue 13): a kiln-compiled module inside
DistributedDataParallel, and FSDP2 (`fully_shard`) over blocks whose forward kiln compiles,
each in 2 processes, train as single-process eager training does.

gloo on the CPU (CI); NCCL on 2 GPUs where the machine has them (marked `gpu`). DDP's gradient
hooks fire per parameter, as in eager, when kiln's backward node hands autograd the gradients;
FSDP2's hooks (all-gather before a block's forward, reduce-scatter after its backward) run in
Python around the compiled forward and backward.
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
def test_fsdp2_with_compiled_blocks_trains_like_one_process(backend):
    _train_in_processes(backend, _fsdp2, compiled_blocks=2)
