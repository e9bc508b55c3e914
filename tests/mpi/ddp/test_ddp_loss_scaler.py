"""PyTorch's mixed-precision recipe with the hook: ``scaler.scale(loss).backward(); scaler.step(optimizer);
scaler.update()``, with ``torch.amp.GradScaler``'s real code path (``unscale_``, ``found_inf``,
``update``) and losses that overflow on rank 0 alone. As with DDP's own allreduce, the Inf average
reaches the scaler, which skips the step and halves its scale; the hook's state is left as before."""
import warnings

import pytest
import torch
import torch.distributed as dist

from hvdsketch.exchange.diagnosis import NonfiniteStep
from tests.loss_scaling import FLAGS, OVERFLOWS, assert_same_state
from hvdsketch.torch.ddp import ExchangeState
from tests.mpi.ddp.cases import assert_replicas_agree, batches, ddp, flat, loss, model, sgd

STEPS = 6


def scaled(compression, memory=None):
    """The parameters, the scale after the run, the hook's state and its state before and after each
    overflowing step, and the hvdsketch warnings this rank saw."""
    module = model()
    wrapped, state = ddp(module, compression, memory=memory)
    optimizer, scaler = sgd(module), torch.amp.GradScaler("cpu")
    around = []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", NonfiniteStep)
        for k, batch in enumerate(batches(STEPS)):
            before = state.session.state_dict() if state is not None and k in OVERFLOWS else None
            optimizer.zero_grad()
            blown = float("inf") if k in OVERFLOWS and dist.get_rank() == 0 else 1.0
            scaler.scale(loss(wrapped, batch) * blown).backward()
            scaler.step(optimizer)  # skipped where the averaged gradients are not finite
            scaler.update()
            if before is not None:
                around.append((before, state.session.state_dict()))
    return module, scaler.get_scale(), around, [w for w in seen if issubclass(w.category, NonfiniteStep)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("compression, memory", FLAGS)
def test_a_loss_scalers_overflowing_steps_are_skipped_as_with_ddps_allreduce(compression, memory):
    """By default: the job finishes, the scale is DDP's, replicas finite and equal; each skipped step
    left every residual, compressor record, decision and the step as they were; rank 0 warned once."""
    reference, reference_scale = scaled(None)[:2]
    module, scale, around, warned = scaled(compression, memory)
    assert scale == reference_scale == 2.0 ** (16 - len(OVERFLOWS))
    assert_replicas_agree(module)
    if compression == "none":
        assert torch.equal(flat(module), flat(reference))
    for before, after in around:
        assert_same_state(before, after)
    assert len(warned) == (1 if dist.get_rank() == 0 else 0)


def test_error_if_nonfinite_raises_on_every_rank_instead():
    module = model()
    wrapped, _ = ddp(module, "topk:ratio=0.25", memory="fp32", error_if_nonfinite=True)
    tokens, labels = batches(1)[0]
    blown = float("inf") if dist.get_rank() == 0 else 1.0
    with pytest.raises(FloatingPointError, match="NaN or Inf"):
        (loss(wrapped, (tokens, labels)) * blown).backward()


@pytest.mark.parametrize("compression, overflows", [("qsgd", True), ("powersgd", True), ("efsignsgd", True),
                                                   ("randomk:ratio=0.1", True), ("terngrad", False), ("sketch", False)])
def test_finite_gradients_near_float32s_limit_are_never_made_nan(compression, overflows):
    """Gradients of about 1e38, finite on every rank, whose dense sums are finite: where a method's
    own arithmetic overflows (QSGD's norms, PowerSGD's products), that tensor is exchanged exactly for
    the step (rank 0 says so once); no NaN comes back and no rank is blamed."""
    named = [("big", torch.nn.Parameter(torch.zeros(64, 48))), ("small", torch.nn.Parameter(torch.zeros(40)))]
    state = ExchangeState(named, compression=compression, memory="fp32")
    world, rank = dist.get_world_size(), dist.get_rank()
    generator = torch.Generator().manual_seed(rank // 2)  # ranks 2k and 2k + 1 cancel: no sum overflows
    big = (torch.rand(64, 48, generator=generator) * 2 - 1) * 1e38 * (-1) ** rank
    small = torch.rand(40, generator=generator)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", NonfiniteStep)
        results = state.session.exchange({"big": big.clone(), "small": small.clone()})
    assert torch.isfinite(results["big"]).all() and torch.isfinite(results["small"]).all()
    said = [[str(w.message) for w in seen]]
    dist.broadcast_object_list(said, src=0)
    assert len(said[0]) == overflows and all(f"overflowed on 'big'" in message for message in said[0])
    assert not seen or rank == 0
    if overflows:
        dense = big.clone()
        dist.all_reduce(dense)
        assert torch.equal(results["big"], dense / world)
    assert state.session.step == 1
