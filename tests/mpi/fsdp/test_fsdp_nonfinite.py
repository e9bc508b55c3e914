"""A step whose averaged gradients are not finite (rank 0's loss blown up to Inf): by default handed
back for the training loop to skip, hvdsketch's state as it was before the step; with
``error_if_nonfinite=True`` an error on every rank (every rank runs these)."""
import warnings

import pytest
import torch
import torch.distributed as dist

from hvdsketch.exchange.diagnosis import NonfiniteStep
from tests.loss_scaling import assert_same_state
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
def test_an_inf_average_is_handed_back_and_the_state_is_as_before(compression):
    """The loop skips the step whose gradients are not finite (as a loss scaler does); the quantizer's
    residuals are the ones before that step, so the steps after it train on finite gradients; rank 0
    warned once."""
    module, reduction = sharded(model(), compression)
    optimizer = adam(module)
    skipped = []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", NonfiniteStep)
        for k, batch in enumerate(batches(4)):
            optimizer.zero_grad()
            before = reduction.session.state_dict() if k == 1 else None
            blown(module, batch, k, overflow=1)
            finite = all(torch.isfinite(p.grad.to_local()).all() for p in module.parameters())
            skipped.append(not finite)
            if before is not None:
                assert_same_state(before, reduction.session.state_dict())
            if finite:
                optimizer.step()
    assert skipped == [False, True, False, False]
    assert torch.isfinite(local(module)).all()
    assert len([w for w in seen if issubclass(w.category, NonfiniteStep)]) == (dist.get_rank() == 0)
