"""hvdsketch's PyTorch optimizer training over the MPI layer (``collectives="mpi"``), on every rank.

The MPI layer matches collectives by the order of calls, and here the ranks' gradient hooks fire in
different orders (rank parity decides which branch the forward pass builds first) and one layer
gets a gradient on even ranks only (the others start it in ``synchronize()``): the exchanger's
launch order must keep every rank's collectives in step. Exact methods must train as dense
averaging does; every method must keep the replicas bit-identical.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hvdsketch.torch import DistributedOptimizer

STEPS = 6


class Branches(torch.nn.Module):
    """An embedding (sparse gradients) feeding two branches built in a rank-dependent order, and a
    head used on even ranks only."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(30000, 8, sparse=True)
        self.left = torch.nn.Linear(8, 6)
        self.right = torch.nn.Linear(8, 6)
        self.even_only = torch.nn.Linear(6, 6)

    def forward(self, tokens: torch.Tensor, rank: int) -> torch.Tensor:
        x = self.embedding(tokens).mean(dim=1)
        first, second = (self.left, self.right) if rank % 2 else (self.right, self.left)
        a, b = first(x), second(x)
        out = a + b
        return self.even_only(out) if rank % 2 == 0 else out


def train(comm, compression: str, memory: str | None = None) -> torch.Tensor:
    rank = comm.Get_rank()
    torch.manual_seed(0)
    model = Branches()
    optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5), model.named_parameters(),
                                     compression=compression, memory=memory, collectives="mpi")
    rng = np.random.default_rng(rank)
    for _ in range(STEPS):
        tokens = torch.from_numpy(rng.integers(0, 30000, (16, 5)))
        target = torch.from_numpy(rng.standard_normal((16, 6)).astype(np.float32))
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(tokens, rank), target).backward()
        optimizer.step()
    optimizer._session.communicator.free()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def same_everywhere(comm, flat: torch.Tensor) -> bool:
    gathered = comm.allgather(flat.numpy().tobytes())
    return all(g == gathered[0] for g in gathered)


@pytest.fixture(scope="module")
def dense(comm):
    return train(comm, "none")


@pytest.mark.parametrize("flag", ["union", "allgather", "allgather:wire=float32"])
def test_exact_methods_train_as_dense_averaging_does(comm, dense, flag):
    got = train(comm, flag)
    assert same_everywhere(comm, got)
    np.testing.assert_allclose(got.numpy(), dense.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("flag, memory", [("sketch:error=0.5,rows=3", None), ("sketch:error=1", "fp32"),
                                          ("union:error=2", "fp32"), ("powersgd:rank=2", None),
                                          ("topk:ratio=0.1", "fp32")])
def test_every_method_keeps_replicas_bit_identical(comm, dense, flag, memory):
    got = train(comm, flag, memory)
    assert same_everywhere(comm, got)
    assert torch.isfinite(got).all() and not torch.equal(got, dense)
