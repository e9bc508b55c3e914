"""Horovod's mixed-precision recipe with hvdsketch's optimizer: ``scaler.scale(loss).backward();
optimizer.synchronize(); scaler.unscale_(optimizer); with optimizer.skip_synchronize():
scaler.step(optimizer); scaler.update()``, with ``torch.amp.GradScaler``'s real code path and losses
that overflow on rank 0 alone. As with Horovod's optimizer, the Inf average reaches the scaler, which
skips the step and halves its scale; hvdsketch's state is left as before; the drop-in alike."""
import warnings

import pytest
import torch

from hvdsketch.exchange.diagnosis import NonfiniteStep
from hvdsketch.torch import Compression, DistributedOptimizer
from tests.loss_scaling import FLAGS, OVERFLOWS, assert_same_state
from tests.mpi.torch.test_optimizer import Net, batch

STEPS = 6


def scaled(hvd, wrap, **arguments):
    """The parameters, the scale after the run, the exchanger's state before and after each
    overflowing step (hvdsketch's optimizer), and the hvdsketch warnings this rank saw."""
    model = Net()
    optimizer = wrap(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
                     **arguments)
    exchanger = getattr(optimizer, "_exchanger", None)
    scaler, around = torch.amp.GradScaler("cpu"), []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", NonfiniteStep)
        for step in range(STEPS):
            before = exchanger.state_dict() if exchanger is not None and step in OVERFLOWS else None
            optimizer.zero_grad()
            tokens, labels = batch(hvd.rank(), step)
            blown = float("inf") if step in OVERFLOWS and hvd.rank() == 0 else 1.0
            scaler.scale(torch.nn.functional.cross_entropy(model(tokens), labels) * blown).backward()
            optimizer.synchronize()
            scaler.unscale_(optimizer)
            with optimizer.skip_synchronize():
                scaler.step(optimizer)  # skipped where the averaged gradients are not finite
            scaler.update()
            if before is not None:
                around.append((before, exchanger.state_dict()))
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return params, scaler.get_scale(), around, [w for w in seen if issubclass(w.category, NonfiniteStep)]


def assert_replicas_agree(hvd, params, name):
    gathered = hvd.allgather(params[None, :], name=f"scaled.{name}")
    assert bool(torch.isfinite(params).all()) and all(torch.equal(gathered[0], row) for row in gathered)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("compression, memory", FLAGS)
def test_a_loss_scalers_overflowing_steps_are_skipped_as_with_horovods_optimizer(hvd, compression, memory):
    """By default: the job finishes, the scale is Horovod's, replicas finite and equal (``none``: bit
    for bit Horovod's); each skipped step left every residual, compressor record, decision and the
    step as they were; rank 0 warned once."""
    reference, reference_scale = scaled(hvd, hvd.DistributedOptimizer)[:2]
    params, scale, around, warned = scaled(hvd, DistributedOptimizer, compression=compression, memory=memory)
    assert scale == reference_scale == 2.0 ** (16 - len(OVERFLOWS))
    assert_replicas_agree(hvd, params, f"{compression}.{memory}")
    if compression == "none":
        assert torch.equal(params, reference)
    for before, after in around:
        assert_same_state(before, after)
    assert len(warned) == (1 if hvd.rank() == 0 else 0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("compression", [Compression.none, Compression.fp16, Compression.sketch(error=0.5)],
                         ids=str)
def test_the_drop_in_in_horovods_optimizer_hands_the_overflow_to_the_scaler(hvd, compression):
    """Horovod's own optimizer with a drop-in compression: the scale is Horovod's, replicas agree."""
    reference_scale = scaled(hvd, hvd.DistributedOptimizer)[1]
    params, scale, _, warned = scaled(hvd, hvd.DistributedOptimizer, compression=compression)
    assert scale == reference_scale
    assert_replicas_agree(hvd, params, f"dropin.{compression}")
    assert len(warned) <= 1
