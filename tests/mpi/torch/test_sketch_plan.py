"""A sketch whose plan is too small for the union it meets is never silent (PyTorch, both paths).

``sketch:error=0.5,density=0.05`` on a dense layer plans for 5% of its rows and meets all of them: the
recovery's error is several times the 0.5 asked for. Every rank sees the overflow alike in the reduced
bitmap, warns once naming the tensor and the expected error, and sizes the next exchange from that
union (dense here, as a sketch of every row would be no smaller). A union within its plan is quiet.
"""
import pytest
import torch

from hvdsketch.torch import Compression, DistributedOptimizer
from tests import sketch_cases as cases
from tests.plan_cases import assert_names_the_error_measured, hvdsketch_warnings


def dense_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.Tanh(), torch.nn.Linear(48, 40))


def steps(hvd, model, optimizer, count: int) -> list[tuple[list[str], dict[tuple[int, ...], float]]]:
    """Per step: the hvdsketch warnings, and each weight matrix's relative error (by shape) against
    Horovod's dense average of the same gradients."""
    rng = torch.Generator().manual_seed(hvd.rank())
    seen = []
    for step in range(count):
        optimizer.zero_grad()
        with hvdsketch_warnings() as messages:
            model(torch.randn(16, 64, generator=rng)).square().mean().backward()
            local = [p.grad.clone() for p in model.parameters()]
            optimizer.synchronize()
        errors = {}
        for i, (p, g) in enumerate(zip(model.parameters(), local)):
            truth = hvd.allreduce(g, name=f"plan.truth.{step}.{i}")
            if p.dim() == 2:
                errors[tuple(p.shape)] = float((p.grad - truth).norm() / truth.norm())
        with optimizer.skip_synchronize():
            optimizer.step()
        seen.append((messages, errors))
    return seen


def assert_warned_once_and_resized(seen, names: dict[tuple[int, ...], str]) -> None:
    (first, errors), later = seen[0], seen[1:]
    for advice in assert_names_the_error_measured(first, errors, names).values():
        assert advice.startswith("the next exchanges are sized from this union")
    for messages, errors in later:
        assert not messages  # once
        assert all(e < 1e-6 for e in errors.values()), errors  # resized: dense, exact


@pytest.mark.timeout(120)
def test_dropin_sketch_on_dense_layers_warns_once_and_resizes(hvd):
    model = dense_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters(),
                                         compression=Compression.sketch(error=0.5, density=0.05, seed=27))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    names = {(48, 64): "shape(48, 64)#0", (40, 48): "shape(40, 48)#0"}  # all the drop-in path knows of them
    assert_warned_once_and_resized(steps(hvd, model, optimizer, 3), names)


@pytest.mark.timeout(120)
def test_hvdsketch_optimizer_sketch_on_dense_layers_warns_once_and_resizes(hvd):
    model = dense_model()
    optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model.named_parameters(),
                                     compression="sketch:error=0.5,density=0.05")
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    assert_warned_once_and_resized(steps(hvd, model, optimizer, 3), {(48, 64): "0.weight", (40, 48): "2.weight"})


@pytest.mark.timeout(60)
def test_a_union_within_its_plan_is_quiet(hvd):
    g = torch.from_numpy(cases.row_sparse_gradient(hvd.rank(), cases.LOSSY_SHAPE, 20, integer=False))
    compression = Compression.sketch(error=0.5, density=0.05, seed=28)  # 100 rows planned, at most 40 met
    with hvdsketch_warnings() as messages:
        payload, ctx = compression.compress(g)
        out = compression.decompress(hvd.allreduce(payload, op=hvd.Average, name="plan.quiet"), ctx)
    truth = cases.dense_average(hvd.size(), cases.LOSSY_SHAPE, 20, False)
    assert 0 < cases.relative_error(out.numpy(), truth) < 0.5 * 3
    assert not messages
