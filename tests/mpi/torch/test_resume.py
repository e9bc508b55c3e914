"""A run resumed from a checkpoint continues exactly as the uninterrupted run (error feedback included)."""
import copy

import numpy as np
import pytest
import torch

from hvdsketch.torch import DistributedOptimizer


def make(memory, compression="sketch:error=0.7,density=0.05"):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(3000, 8), torch.nn.Flatten(), torch.nn.Linear(8 * 6, 4))
    optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9),
                                     model.named_parameters(), compression=compression, memory=memory)
    return model, optimizer


def train(model, optimizer, steps, rank, start):
    for step in range(start, start + steps):
        rng = np.random.default_rng([rank, step])
        tokens = torch.from_numpy(rng.integers(0, 3000, size=(16, 6)))
        labels = torch.from_numpy(rng.integers(0, 4, size=16))
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(tokens), labels).backward()
        optimizer.step()


@pytest.mark.parametrize("memory", ["fp32", "fp16", "topk:ratio=0.2"])
def test_resume_is_bit_identical(hvd, memory):
    model, optimizer = make(memory)
    train(model, optimizer, 10, hvd.rank(), 0)
    checkpoint = copy.deepcopy({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
    assert checkpoint["optimizer"]["hvdsketch"]["memory"] is not None
    train(model, optimizer, 10, hvd.rank(), 10)

    resumed_model, resumed_optimizer = make(memory)
    resumed_model.load_state_dict(checkpoint["model"])
    resumed_optimizer.load_state_dict(checkpoint["optimizer"])
    train(resumed_model, resumed_optimizer, 10, hvd.rank(), 10)

    for a, b in zip(model.parameters(), resumed_model.parameters()):
        assert torch.equal(a, b)
    # and without the residuals the continuation differs: the test can fail
    forgetful_model, forgetful_optimizer = make(memory)
    forgetful_model.load_state_dict(checkpoint["model"])
    state = dict(checkpoint["optimizer"], hvdsketch={"step": 10, "memory": None})
    forgetful_optimizer.load_state_dict(state)
    train(forgetful_model, forgetful_optimizer, 10, hvd.rank(), 10)
    assert not all(torch.equal(a, b) for a, b in zip(model.parameters(), forgetful_model.parameters()))


@pytest.mark.parametrize("compression", ["powersgd:rank=2", "dgc:ratio=0.05", "efsignsgd", "sketch:error=0.5",
                                         {"rules": [{"name": "0.*", "compression": "dgc:ratio=0.1"}],
                                          "default": "powersgd:rank=1"}], ids=str)
def test_compressor_state_is_in_the_checkpoint(hvd, compression):
    """PowerSGD's Q and residuals, DGC's velocity and accumulation, EF-SignSGD's residuals (the
    methods' own error feedback), the sketch's dense latch:
    resumed equals uninterrupted bit for bit, and starting them afresh differs where there is state."""
    model, optimizer = make(None, compression)
    train(model, optimizer, 6, hvd.rank(), 0)
    checkpoint = copy.deepcopy({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
    train(model, optimizer, 6, hvd.rank(), 6)

    resumed_model, resumed_optimizer = make(None, compression)
    resumed_model.load_state_dict(checkpoint["model"])
    resumed_optimizer.load_state_dict(checkpoint["optimizer"])
    train(resumed_model, resumed_optimizer, 6, hvd.rank(), 6)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), resumed_model.parameters()))

    ours = checkpoint["optimizer"]["hvdsketch"]
    saved = ours["compressors"]
    assert saved or ours["own_memory"]["slots"], "a stateful method saved no state"  # EF-SignSGD: residuals
    if str(compression).startswith("sketch"):  # the dense linear layer is latched; dense either way afresh
        assert set(saved["sketch"]["_dense_for"]) == {"2.weight", "2.bias"}
        return
    fresh_model, fresh_optimizer = make(None, compression)
    fresh_model.load_state_dict(checkpoint["model"])
    fresh_optimizer.load_state_dict(dict(checkpoint["optimizer"], hvdsketch={"step": 6, "memory": None}))
    train(fresh_model, fresh_optimizer, 6, hvd.rank(), 6)
    assert not all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh_model.parameters()))


def test_a_checkpoint_of_another_method_is_a_clear_error(hvd):
    model, optimizer = make(None, "powersgd:rank=2")
    train(model, optimizer, 2, hvd.rank(), 0)
    _, other = make(None, "dgc:ratio=0.05")
    with pytest.raises(ValueError, match="powersgd:rank=2.*does not use"):
        other.load_state_dict(optimizer.state_dict())
