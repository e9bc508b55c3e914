"""The quantized reduce-scatter with error feedback, on real gloo process groups (every rank runs these)."""
import math

import pytest
import torch
import torch.distributed as dist

from hvdsketch.collectives.torchdist import TorchDistCommunicator
from hvdsketch.exchange.session import Session
from hvdsketch.memory import create as create_memory
from hvdsketch.ops import torch as torch_ops
from tests.mpi.fsdp.cases import adam, batches, local, loss, model, sharded, step

ROWS, WIDTH = 10, 24  # each rank's block: 240 elements, runs of 64 with a ragged last one


def exchanger(flag: str) -> tuple:
    memory = create_memory("fp32")
    return Session(flag, memory, TorchDistCommunicator(), torch_ops, scatter=True, prefix=f"test.{flag}"), memory


def inputs() -> torch.Tensor:
    """This rank's tensor: every rank's block, values of very different sizes."""
    generator = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(dist.get_world_size() * ROWS, WIDTH, generator=generator)
    return x * torch.logspace(-3, 1, WIDTH)


def gathered(x: torch.Tensor) -> torch.Tensor:
    every = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(every, x)
    return torch.stack(every)


@pytest.mark.parametrize("bits", [8, 4])
def test_what_was_sent_plus_the_residual_is_the_input_on_every_rank(bits):
    """The owners average what was sent: every rank's input less the residual it keeps; the residual
    is at most half a level of its run's largest magnitude, and not nothing."""
    flag = f"quantize:bits={bits},block=64"
    ex, memory = exchanger(flag)
    x = inputs()
    ex.start("x", x.clone())
    result = ex.complete("x")
    ex.finish()
    residual = memory.compensate("x", torch.zeros_like(x))
    sent = gathered(x - residual)
    rank, size = dist.get_rank(), dist.get_world_size()
    own = sent.mean(0)[rank * ROWS:(rank + 1) * ROWS]
    torch.testing.assert_close(result, own, rtol=0, atol=4 * size * 2.0 ** -24 * sent.abs().max().item())
    levels = 2 ** (bits - 1) - 1
    flat, errors = x.reshape(size, -1), residual.reshape(size, -1)
    for start in range(0, flat.shape[1], 64):
        peak = flat[:, start:start + 64].abs().amax(1, keepdim=True)
        assert (errors[:, start:start + 64].abs() <= peak / (2 * levels) * (1 + 1e-6)).all()
    assert residual.abs().sum() > 0


def test_error_feedback_carries_what_each_step_left_out():
    """The same inputs step after step: the results add up to the steps' exact averages, less only
    the ranks' last residuals (averaged), as error feedback promises."""
    ex, memory = exchanger("quantize:bits=4,block=64")
    x, steps = inputs(), 5
    total = torch.zeros(ROWS, WIDTH, dtype=torch.float64)
    for _ in range(steps):
        ex.start("x", x.clone())
        total += ex.complete("x").double()
        ex.finish()
    rank = dist.get_rank()
    residual = memory.compensate("x", torch.zeros_like(x))
    expected = steps * gathered(x).double().mean(0) - gathered(residual).double().mean(0)
    block = slice(rank * ROWS, (rank + 1) * ROWS)
    torch.testing.assert_close(total, expected[block], rtol=0, atol=1e-5 * x.abs().max().item())
    assert (total - steps * gathered(x).double().mean(0)[block]).abs().max() > 0  # it was lossy


def test_fsdp_trains_with_eight_bit_codes_as_with_its_own_reduce_scatter():
    """Six Adam steps of the LM: the parameters and losses of FSDP's own reduce-scatter, nearly."""
    data = batches(6)
    final = {}
    for compression in (None, "quantize:block=32"):
        module, reduction = sharded(model(), compression)
        optimizer = adam(module)
        for batch in data:
            step(module, optimizer, batch)
        final[compression] = (local(module), sum(loss(module, b).item() for b in data))
    # the parameters moved alike: within a few percent of the distance Adam took them
    start = local(sharded(model())[0])
    moved = (final[None][0] - start).norm()
    assert (final["quantize:block=32"][0] - final[None][0]).norm() < 0.05 * moved
    assert math.isclose(final["quantize:block=32"][1], final[None][1], rel_tol=0.02)
    report = reduction.report()  # a byte a code and 4 a scale of 32, against 4 an element
    assert report["residual_bytes"] > 0
    assert report["collectives"]["alltoall"]["bytes_sent"] < 0.4 * report["bytes_dense_reduce_scatter"]
