"""mode="reduce-overhead": compiled CUDA programs recorded as CUDA graphs and replayed (issue 12,
part 2). The first call of an entry runs as usual, the second records and replays, later ones
replay. Every test compares with eager on fresh inputs and checks, through kiln.stats(), that
graphs were recorded and replayed (a test of replay that passed without one would prove nothing).
"""
import pytest
import torch
import torch.nn.functional as F

import kiln
from _helpers import assert_same

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _counts():
    s = kiln.stats()
    return s["cudagraph_recordings"], s["cudagraph_replays"]


def test_replays_equal_eager_on_fresh_inputs():
    w = torch.randn(64, 64, device="cuda")

    def fn(x, y):
        return F.gelu(x @ w) * y.sigmoid() + 1, (x - y).sum(-1)

    cf = kiln.compile(fn, mode="reduce-overhead")
    rec0, rep0 = _counts()
    for _ in range(5):
        x, y = torch.randn(32, 64, device="cuda"), torch.randn(32, 64, device="cuda")
        assert_same(cf(x, y), fn(x, y), rtol=1e-4, atol=1e-4)
    rec, rep = _counts()
    assert rec - rec0 == 1 and rep - rep0 == 4, (rec - rec0, rep - rep0)
    assert kiln.explain(cf)(x, y).cudagraphs == ["recorded on the entry's second call, replayed from then on"]


def test_parameters_updated_in_place_between_calls_are_seen():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).cuda().eval()
    cf = kiln.compile(model, mode="reduce-overhead")
    x = torch.randn(4, 32, device="cuda")
    rec0, _ = _counts()
    with torch.no_grad():
        for step in range(4):
            assert_same(cf(x), model(x), rtol=1e-4, atol=1e-4)
            for p in model.parameters():
                p.mul_(0.9).add_(0.01 * step)  # an optimizer step: same memory, new values
    assert _counts()[0] - rec0 == 1  # parameters read where they lie: never recorded again


def test_an_input_passed_again_is_not_copied_and_a_new_one_is():
    def fn(x):
        return x * 2 + 1

    cf = kiln.compile(fn, mode="reduce-overhead")
    a = torch.randn(1000, device="cuda")
    for _ in range(3):
        assert_same(cf(a), fn(a))
    a.add_(5)  # the same tensor, changed in place: read in place, so the change is seen
    assert_same(cf(a), fn(a))
    for _ in range(3):
        b = torch.randn(1000, device="cuda")
        assert_same(cf(b), fn(b))


def test_an_output_overwritten_by_a_later_replay_raises_on_access():
    def fn(x):
        return x.sin() * 3

    cf = kiln.compile(fn, mode="reduce-overhead")
    x1, x2, x3 = (torch.randn(256, device="cuda") for _ in range(3))
    cf(x1)              # warm-up
    y2 = cf(x2)         # recorded and replayed
    kept = y2.clone()   # a clone outlives the next replay
    y3 = cf(x3)
    with pytest.raises(RuntimeError, match="overwritten by a subsequent run"):
        y2 + 1
    assert_same(kept, fn(x2))
    assert_same(y3, fn(x3))


def test_an_output_fed_back_as_the_next_input():
    def fn(x):
        return torch.tanh(x) + 0.5

    cf = kiln.compile(fn, mode="reduce-overhead")
    x = torch.randn(512, device="cuda")
    expected = x
    y = x
    for _ in range(5):
        expected = fn(expected)
        y = cf(y)
        assert_same(y, expected)


def test_in_place_update_of_an_input_is_written_back_on_every_replay():
    def step(cache, x):
        cache.mul_(0.5).add_(x)
        return cache.sum()

    cf = kiln.compile(step, mode="reduce-overhead")
    cache_k, cache_e = torch.zeros(64, device="cuda"), torch.zeros(64, device="cuda")
    rec0, rep0 = _counts()
    for _ in range(5):
        x = torch.randn(64, device="cuda")
        assert_same(cf(cache_k, x), step(cache_e, x), rtol=1e-5, atol=1e-5)
        assert_same(cache_k, cache_e, rtol=1e-5, atol=1e-5)
    assert _counts()[0] - rec0 == 1 and _counts()[1] - rep0 == 4


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_16_bit_transformer_layer(dtype):
    torch.manual_seed(0)
    ln = torch.nn.LayerNorm(128).cuda().to(dtype)
    up, down = torch.nn.Linear(128, 512).cuda().to(dtype), torch.nn.Linear(512, 128).cuda().to(dtype)

    def layer(x):
        return x + down(F.gelu(up(ln(x))))

    cf = kiln.compile(layer, mode="reduce-overhead")
    rec0, rep0 = _counts()
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(8, 16, 128, device="cuda").to(dtype)
            assert_same(cf(x), layer(x), rtol=3e-2, atol=3e-2)
    assert _counts()[0] - rec0 == 1 and _counts()[1] - rep0 == 3


def test_max_autotune_records_too():
    cf = kiln.compile(lambda x: x.exp() - 1, mode="max-autotune")
    rec0, _ = _counts()
    for _ in range(3):
        x = torch.randn(100, device="cuda")
        assert_same(cf(x), x.exp() - 1)
    assert _counts()[0] - rec0 == 1


def test_default_mode_records_nothing():
    cf = kiln.compile(lambda x: x.exp() - 1)
    rec0, rep0 = _counts()
    for _ in range(3):
        cf(torch.randn(100, device="cuda"))
    assert _counts() == (rec0, rep0)


@pytest.mark.parametrize("case", ["output_is_input", "cpu_scalar"])
def test_programs_a_graph_cannot_hold_run_as_usual_with_the_reason(case):
    fns = {
        "output_is_input": (lambda x: (x, x.cos()), {}, "an output is an input"),
        "cpu_scalar": (lambda x, s: x * s, {}, "copied to the GPU per call"),
    }
    fn, kw, why = fns[case]
    cf = kiln.compile(fn, mode="reduce-overhead", **kw)
    rec0, rep0 = _counts()
    for n in (64, 64, 96, 96):
        args = (torch.randn(n, device="cuda"),) + ((torch.tensor(3.0),) if case == "cpu_scalar" else ())
        assert_same(cf(*args), fn(*args))
    assert _counts() == (rec0, rep0)
    notes = kiln.explain(cf)(*args).cudagraphs
    assert notes and all(why in n for n in notes), notes
    assert any(why in r for r in kiln.stats()["fallback_reasons"])


def test_a_recording_that_fails_runs_as_usual_with_the_reason():
    def fn(x):
        return torch.nonzero(x > 0).float().sum() + x.sum()  # nonzero synchronizes with the host

    cf = kiln.compile(fn, mode="reduce-overhead")
    for _ in range(4):
        x = torch.randn(50, device="cuda")
        assert_same(cf(x), fn(x), rtol=1e-5, atol=1e-4)
    reasons = kiln.stats()["fallback_reasons"]
    assert any(r.startswith("cudagraphs:") for r in reasons), reasons


def test_a_shape_generic_entry_records_each_size_and_replays_it():
    w = torch.randn(64, 64, device="cuda")

    def fn(x):
        return torch.softmax(x @ w, dim=-1) * x.shape[0]

    cf = kiln.compile(fn, mode="reduce-overhead", dynamic=True)
    rec0, rep0 = _counts()
    for n in (16, 16, 16, 40, 40, 40, 16, 40):
        x = torch.randn(n, 64, device="cuda")
        assert_same(cf(x), fn(x), rtol=1e-4, atol=1e-5)
    rec, rep = _counts()
    # each size: a warm-up call, then recorded; two sizes, six calls after their warm-ups
    assert (rec - rec0, rep - rep0) == (2, 6), (rec - rec0, rep - rep0)
    assert kiln.stats()["graphs_compiled"] >= 1
    notes = kiln.explain(cf)(x).cudagraphs
    assert notes and "per size" in notes[0], notes


def test_a_replay_of_another_size_overwrites_the_previous_calls_outputs():
    cf = kiln.compile(lambda x: x.sin() * 3, mode="reduce-overhead", dynamic=True)
    a, b = torch.randn(300, device="cuda"), torch.randn(500, device="cuda")
    for x in (a, a, b, b):  # both sizes recorded
        cf(x)
    ya = cf(a)
    kept = ya.clone()
    yb = cf(b)  # another size's graph, in the same pool
    with pytest.raises(RuntimeError, match="overwritten by a subsequent run"):
        ya + 1
    assert_same(kept, a.sin() * 3)
    assert_same(yb, b.sin() * 3)


def test_sizes_past_the_bound_run_without_cuda_graphs_with_the_reason():
    fn = lambda x: x.cos() * 2  # noqa: E731
    cf = kiln.compile(fn, mode="reduce-overhead", dynamic=True)
    rec0, _ = _counts()
    for n in range(10, 22):  # twelve sizes, each called twice
        for _ in range(2):
            x = torch.randn(n, 8, device="cuda")
            assert_same(cf(x), fn(x))
    assert _counts()[0] - rec0 == 8
    assert any("more than 8 sizes" in r for r in kiln.stats()["fallback_reasons"])
    x = torch.randn(10, 8, device="cuda")  # a recorded size still replays
    _, rep = _counts()
    assert_same(cf(x), fn(x))
    assert _counts()[1] == rep + 1


class StaticCacheStep(torch.nn.Module):
    """One decoder step's cache write: a buffer updated where it lies (index_copy_ in place),
    then read by the attention that follows."""

    def __init__(self):
        super().__init__()
        self.register_buffer("keys", torch.zeros(1, 2, 16, 8))

    def forward(self, pos, new, q):
        self.keys.index_copy_(2, pos, new)
        return F.scaled_dot_product_attention(q, self.keys, self.keys)


def test_a_static_cache_updated_in_place_across_replays():
    ours, ref = StaticCacheStep().cuda(), StaticCacheStep().cuda()
    cf = kiln.compile(ours, mode="reduce-overhead")
    assert any("(in place)" in line for line in str(kiln.explain(cf)(torch.tensor([0], device="cuda"),
               torch.zeros(1, 2, 1, 8, device="cuda"), torch.zeros(1, 2, 1, 8, device="cuda")).loop_ir).splitlines())
    rec0, rep0 = _counts()  # after explain, which starts the counters afresh
    for step in range(6):
        pos = torch.tensor([step], device="cuda")
        new, q = torch.randn(1, 2, 1, 8, device="cuda"), torch.randn(1, 2, 1, 8, device="cuda")
        assert_same(cf(pos, new, q), ref(pos, new, q), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(ours.keys, ref.keys)
    rec, rep = _counts()
    assert rec - rec0 == 1 and rep - rep0 >= 4, (rec - rec0, rep - rep0)


def test_an_input_updated_in_place_reaches_the_callers_tensor_when_copied_for_the_graph():
    def fn(cache, pos, new):
        cache.index_copy_(0, pos, new)
        return cache.sum(0)

    cf = kiln.compile(fn, mode="reduce-overhead")
    for step in range(4):
        cache = torch.randn(8, 32, device="cuda")  # a new tensor each call: copied into the recording's
        ref = cache.clone()
        pos, new = torch.tensor([step], device="cuda"), torch.randn(1, 32, device="cuda")
        assert_same(cf(cache, pos, new), fn(ref, pos, new), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(cache, ref)
