"""A step whose averaged gradients are not finite (rank 0's loss blown up to Inf): an error on every
rank, or, with ``error_if_nonfinite=False``, handed back for the training loop to skip, hvdsketch's
state restarting finite (every rank runs these)."""
import pytest
import torch
import torch.distributed as dist

from hvdsketch.exchange.exchanger import NonfiniteStep
from tests.mpi.fsdp.cases import adam, batches, local, loss, model, sharded


def blown(module, batch, k: int, overflow: int) -> None:
    """Backward of the loss, Inf on rank 0 at step ``overflow``."""
    factor = float("inf") if k == overflow and dist.get_rank() == 0 else 1.0
    (loss(module, batch) * factor).backward()


def test_an_inf_average_raises_on_every_rank():
    module, _ = sharded(model(), "quantize", error_if_nonfinite=True)
    with pytest.raises(FloatingPointError, match="NaN or Inf"):
        blown(module, batches(1)[0], 0, 0)


@pytest.mark.parametrize("compression", ["fp16:dtype=bfloat16", "quantize:block=32"])
def test_an_inf_average_is_handed_back_and_the_state_restarts_finite(compression):
    """The loop skips the step whose gradients are not finite (as a loss scaler does); the quantizer's
    residuals, which the Inf reached, start again, so the steps after it train on finite gradients."""
    module, reduction = sharded(model(), compression, error_if_nonfinite=False)
    optimizer = adam(module)
    skipped = []
    for k, batch in enumerate(batches(4)):
        optimizer.zero_grad()
        if k == 1:
            with pytest.warns(NonfiniteStep, match="step 1 on rank"):
                blown(module, batch, k, overflow=1)
        else:
            blown(module, batch, k, overflow=1)
        finite = all(torch.isfinite(p.grad.to_local()).all() for p in module.parameters())
        skipped.append(not finite)
        if finite:
            optimizer.step()
    assert skipped == [False, True, False, False]
    assert torch.isfinite(local(module)).all()
