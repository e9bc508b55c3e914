"""The hook's state in a checkpoint: gathered from every rank, saved by rank 0, resumed bit for bit."""
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from hvdsketch.exchange.checkpoint import StateReset
from tests.mpi.ddp.cases import batches, ddp, flat, model, sgd, train

#: Residual memory, compressors' own state (PowerSGD's warm start, DGC's velocity) and auto's decisions.
SETUPS = [("topk:ratio=0.2", "fp32"), ("powersgd:rank=2", None), ("dgc:ratio=0.2", None),
          ("randomk:ratio=0.2", "fp32"), ("auto:warmup=1,bandwidth=100kbit", "fp32")]


def shared_path(tmp_path: Path) -> Path:
    """Rank 0's temporary folder, for every rank (one machine)."""
    chosen = [str(tmp_path)]
    dist.broadcast_object_list(chosen, src=0)
    return Path(chosen[0]) / "checkpoint.pt"


def run(compression, memory, data, path=None, save=None, load=None, **kwargs):
    """Train on ``data``; after ``save`` steps every rank gathers the state and rank 0 saves it to
    ``path``; with ``load``, first resume model and optimizer from ``path``, and the hook unless
    ``load == "model"``."""
    module = model()
    wrapped, state = ddp(module, compression, memory=memory)
    optimizer = sgd(module)
    if load:
        saved = torch.load(path)
        module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        if load != "model":
            state.load_state_dict(saved["hook"], **kwargs)
    for i, batch in enumerate(data):
        train(wrapped, optimizer, [batch])
        if save is not None and i + 1 == save:
            hook = state.state_dict()
            if dist.get_rank() == 0:
                torch.save({"model": module.state_dict(), "optimizer": optimizer.state_dict(), "hook": hook}, path)
            dist.barrier()
    return flat(module), state


@pytest.mark.parametrize("compression, memory", SETUPS, ids=[c for c, _ in SETUPS])
def test_a_rank0_file_resumes_every_rank_bit_for_bit(compression, memory, tmp_path):
    path, data = shared_path(tmp_path), batches(6)
    straight, state = run(compression, memory, data, path, save=3)
    assert state.report()["steps"] == 6
    resumed, state = run(compression, memory, data[3:], path, load=True)
    assert state.session.step == 6
    assert torch.equal(resumed, straight)
    afresh, _ = run(compression, memory, data[3:], path, load="model")
    assert not torch.equal(afresh, straight)  # the hook's state is what makes it exact


def test_another_setup_is_a_clear_error_or_an_opted_in_reset(tmp_path):
    path, data = shared_path(tmp_path), batches(3)
    run("topk:ratio=0.2", "fp32", data, path, save=2)
    with pytest.raises(ValueError, match="compression 'topk:ratio=0.2' with memory 'fp32'.*reset_on_change=True"):
        run("topk:ratio=0.3", "fp32", [], path, load=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed, state = run("topk:ratio=0.3", "fp32", data[2:], path, load=True, reset_on_change=True)
    assert state.session.step == 3
    assert any(issubclass(w.category, StateReset) for w in caught) == (dist.get_rank() == 0)


def test_a_damaged_checkpoint_is_a_clear_error(tmp_path):
    path, data = shared_path(tmp_path), batches(2)
    run("topk:ratio=0.2", "fp32", data, path, save=2)
    saved = torch.load(path)
    saved["hook"]["hvdsketch"]["ranks"][0]["step"] += 1
    module = model()
    _, state = ddp(module, "topk:ratio=0.2", memory="fp32")
    with pytest.raises(ValueError, match="damaged"):
        state.load_state_dict(saved["hook"])
    with pytest.raises(ValueError, match="no 'hvdsketch' entry"):
        state.load_state_dict({"model": {}})
