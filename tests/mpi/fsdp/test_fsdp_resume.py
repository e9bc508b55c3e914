"""A run resumed from ``torch.distributed.checkpoint`` (model, optimizer and hvdsketch's state, each rank
its own shards) continues bit for bit as the run that did not stop; so does one resumed from a file per
rank read by ``torch.load``'s default (every rank runs these)."""
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from tests.mpi.fsdp.cases import adam, batches, local, model, sharded, step

#: Methods whose state a resume must carry: residuals (float32 and 16-bit stores), auto's decisions.
COMPRESSIONS = [("quantize:bits=4,block=32", None), ("quantize:block=32", "fp16"), ("rows:wire=bfloat16", "fp32"),
                ("auto:warmup=1,bandwidth=10mbit,latency=100us", None)]


def folder() -> Path:
    """A folder every rank sees (rank 0's)."""
    made = [tempfile.mkdtemp(prefix="hvdsketch-fsdp-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(made)
    return Path(made[0])


def save(module, optimizer, reduction, path: Path, how: str) -> None:
    model_state, optimizer_state = get_state_dict(module, optimizer)
    if how == "dcp":
        dcp.save({"model": model_state, "optimizer": optimizer_state, "hvdsketch": reduction}, checkpoint_id=path)
    else:
        torch.save({"model": model_state, "optimizer": optimizer_state, "hvdsketch": reduction.state_dict()},
                   path / f"rank{dist.get_rank()}.pt")


def load(module, optimizer, reduction, path: Path, how: str) -> None:
    model_state, optimizer_state = get_state_dict(module, optimizer)
    if how == "dcp":
        loaded = {"model": model_state, "optimizer": optimizer_state, "hvdsketch": reduction}
        dcp.load(loaded, checkpoint_id=path)
    else:
        loaded = torch.load(path / f"rank{dist.get_rank()}.pt")  # PyTorch's default: weights_only=True
        reduction.load_state_dict(loaded["hvdsketch"])
    set_state_dict(module, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optimizer"])


def trained(compression: str, memory: str | None, data: list, resume_at: int, how: str = "dcp"):
    """This rank's parameters after training on ``data``: the run that did not stop, saving a checkpoint
    after ``resume_at`` steps, and a new model, optimizer and hvdsketch state loaded from it that
    trains the rest."""
    path = folder()
    module, reduction = sharded(model(), compression, memory=memory)
    optimizer = adam(module)
    for done, batch in enumerate(data):
        if done == resume_at:
            save(module, optimizer, reduction, path, how)
        step(module, optimizer, batch)
    uninterrupted = local(module)
    module, reduction = sharded(model(seed=1), compression, memory=memory)  # other weights: the load sets them
    optimizer = adam(module)
    load(module, optimizer, reduction, path, how)
    assert reduction.session.step == resume_at
    for batch in data[resume_at:]:
        step(module, optimizer, batch)
    return uninterrupted, local(module)


@pytest.mark.parametrize("compression, memory", COMPRESSIONS, ids=str)
def test_a_resume_through_distributed_checkpoint_continues_bit_for_bit(compression, memory):
    uninterrupted, resumed = trained(compression, memory, batches(5), resume_at=3)
    assert torch.equal(resumed, uninterrupted)


def test_a_resume_from_a_file_per_rank_continues_bit_for_bit():
    uninterrupted, resumed = trained("quantize:bits=4,block=32", None, batches(4), resume_at=2, how="files")
    assert torch.equal(resumed, uninterrupted)


def test_a_checkpoint_of_another_setup_is_a_clear_error_or_a_reset():
    module, reduction = sharded(model(), "quantize")
    step(module, adam(module), batches(1)[0])
    saved = reduction.state_dict()
    other, fresh = sharded(model(), "quantize:bits=4")
    with pytest.raises(ValueError, match="made with setup 'compression quantize memory None'"):
        fresh.load_state_dict(saved)
    fresh.load_state_dict(saved, reset_on_change=True)
    assert fresh.session.step == 1 and fresh.report()["residual_bytes"] == 0
