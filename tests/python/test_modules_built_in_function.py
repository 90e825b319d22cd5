"""torch.nn modules built inside the compiled function that own parameters or buffers
(nn.Linear(5, 3)(x)): eager draws their parameters at every call, so the compiled call builds
the module again at every call, after its guards held, and the graph reads the parameters as
inputs. Results, gradients and torch's generator afterwards equal eager's under one seed."""
import pytest
import torch
from torch import nn

import kiln


def run_seeded(fn, *args, seed=7):
    torch.manual_seed(seed)
    out = fn(*args)
    return out, torch.rand(3)  # what the generator gives next: the same draws happened before


def linear_twice(x, y):
    lin = nn.Linear(5, 3)
    return lin(x) + lin(y)


def test_results_and_the_generator_after_the_call_equal_eagers():
    compiled = kiln.compile(linear_twice)
    for seed in (1, 2, 3):
        x, y = torch.randn(4, 5), torch.randn(4, 5)
        want, after_eager = run_seeded(linear_twice, x, y, seed=seed)
        got, after_kiln = run_seeded(compiled, x, y, seed=seed)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(after_kiln, after_eager)
    assert kiln.explain(linear_twice)(x, y).graph_count == 1
    assert kiln.stats()["eager_fallbacks"] == 0


def test_gradients_reach_the_inputs_and_the_result_requires_grad():
    x = torch.randn(4, 5, requires_grad=True)
    y = torch.randn(4, 5)
    x2 = x.detach().clone().requires_grad_()
    want, _ = run_seeded(linear_twice, x, y)
    got, _ = run_seeded(kiln.compile(linear_twice), x2, y)
    assert got.requires_grad and got.grad_fn is not None
    want.pow(2).sum().backward()
    got.pow(2).sum().backward()
    torch.testing.assert_close(x2.grad, x.grad)


def test_under_no_grad_the_result_does_not_require_grad():
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    with torch.no_grad():
        want, _ = run_seeded(linear_twice, x, y)
        got, _ = run_seeded(kiln.compile(linear_twice), x, y)
    assert not got.requires_grad
    torch.testing.assert_close(got, want)


def batch_norm_in_training(x):
    bn = nn.BatchNorm1d(5)  # training mode: batch statistics, running stats updated in place
    return bn(x) * 2, bn.num_batches_tracked + 0


def test_batch_norm_built_in_training_mode():
    x = torch.randn(8, 5)
    want, _ = run_seeded(batch_norm_in_training, x)
    got, _ = run_seeded(kiln.compile(batch_norm_in_training), x)
    torch.testing.assert_close(got, want)


def test_a_new_default_dtype_builds_float64_parameters(request):
    before = torch.get_default_dtype()
    request.addfinalizer(lambda: torch.set_default_dtype(before))
    compiled = kiln.compile(linear_twice)
    for dtype in (torch.float32, torch.float64):
        torch.set_default_dtype(dtype)
        x, y = torch.randn(4, 5), torch.randn(4, 5)
        want, _ = run_seeded(linear_twice, x, y)
        got, _ = run_seeded(compiled, x, y)
        assert got.dtype == want.dtype == dtype
        torch.testing.assert_close(got, want)


def hands_the_module_out(x):
    lin = nn.Linear(5, 3)
    return lin(x), lin


def test_a_module_handed_out_runs_eagerly_with_a_reason():
    """Building it again for the caller would draw other parameters than the result used."""
    x = torch.randn(4, 5)
    (want, want_mod), _ = run_seeded(hands_the_module_out, x)
    with pytest.warns(UserWarning):
        (got, got_mod), _ = run_seeded(kiln.compile(hands_the_module_out), x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_mod.weight, want_mod.weight)
    reasons = [r["reason"] for r in kiln.explain(hands_the_module_out)(x).break_reasons]
    assert any("owning parameters drawn at every call" in r for r in reasons), reasons


def built_then_break(x):
    lin = nn.Linear(5, 5)
    h = lin(x)
    print("between")  # a graph break: the module lives on in the resume function
    return lin(h)


def test_a_built_module_across_a_graph_break_equals_eager(capsys):
    x = torch.randn(4, 5)
    want, after_eager = run_seeded(built_then_break, x)
    got, after_kiln = run_seeded(kiln.compile(built_then_break), x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(after_kiln, after_eager)
