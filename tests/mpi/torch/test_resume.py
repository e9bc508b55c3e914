"""A run resumed from a checkpoint continues exactly as the uninterrupted run (error feedback included)."""
import copy

import numpy as np
import pytest
import torch

from hvdsketch.torch import DistributedOptimizer


def make(memory):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(3000, 8), torch.nn.Flatten(), torch.nn.Linear(8 * 6, 4))
    optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9),
                                     model.named_parameters(), compression="sketch:error=0.7,density=0.05",
                                     memory=memory)
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
