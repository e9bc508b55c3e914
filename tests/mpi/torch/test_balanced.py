"""The balanced exact method over Horovod's PyTorch collectives (its alltoall with splits): the dense
average in every support scenario (tests/exact_cases.py), and training through DistributedOptimizer
as the dense exchange trains."""
import numpy as np
import pytest
import torch

from hvdsketch.collectives.horovod import HorovodCommunicator
from hvdsketch.torch import DistributedOptimizer
from tests import exact_cases as cases


@pytest.mark.parametrize("flag", cases.FLAGS)
@pytest.mark.parametrize("scenario", cases.SCENARIOS)
def test_equals_the_dense_average(hvd, scenario, flag):
    comm = HorovodCommunicator(hvd)
    cases.check(flag, scenario, hvd.size(), hvd.rank(), comm, torch.from_numpy)
    counted = comm.stats.snapshot()
    if scenario not in ("all_empty",):
        assert "alltoall" in counted  # the rows travelled in Horovod's alltoall


def train(hvd, compression: str, steps: int = 5) -> torch.Tensor:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(3000, 8, sparse=True), torch.nn.Flatten(), torch.nn.Linear(40, 3))
    optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     [(f"{compression}.{n}", p) for n, p in model.named_parameters()],
                                     compression=compression)
    rng = np.random.default_rng(hvd.rank())
    for _ in range(steps):
        tokens = torch.from_numpy(rng.integers(0, 3000 if hvd.rank() else 40, size=(16, 5)))
        optimizer.zero_grad()
        model(tokens).pow(2).mean().backward()
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_distributed_optimizer_trains_as_the_dense_exchange(hvd):
    """Sparse embedding gradients (rank 0's from 40 words, the others' from 3000) through the
    optimizer: the same parameters as dense averaging, on every rank."""
    ours, dense = train(hvd, "balanced"), train(hvd, "none")
    torch.testing.assert_close(ours, dense, rtol=1e-5, atol=1e-6)
    gathered = hvd.allgather(ours[None, :], name="balanced.replicas")
    assert all(torch.equal(gathered[0], row) for row in gathered)
