"""Per-tensor policies over Horovod's PyTorch collectives: every rank agrees on auto's assignment
even when their statistics differ, and training through a policy is exactly the per-tensor exchange
it announces."""
import zlib

import numpy as np
import pytest
import torch

from hvdsketch.collectives.horovod import HorovodCommunicator
from hvdsketch.compress import RowSparse, TensorContext, create
from hvdsketch.policy import AutoPolicy, Policy
from hvdsketch.torch import DistributedOptimizer

SLOW = "bandwidth=10mbit,latency=100us"  # declared, so compressing pays whatever the machine measures


def agreed(hvd, text: str) -> bool:
    """Whether every rank passed the same ``text``."""
    digests = hvd.allgather(torch.tensor([zlib.crc32(text.encode())], dtype=torch.int64), name="agreed")
    return bool((digests == digests[0]).all())


def local_gradients(rank: int, step: int) -> list:
    """Rank 0's embedding gradient is dense, the others' touch 1% of the rows; the matrix is dense."""
    rng = np.random.default_rng(100 * rank + step)
    if rank == 0:
        emb = torch.from_numpy(rng.normal(size=(4000, 32)).astype(np.float32))
    else:
        rows = np.sort(rng.choice(4000, 40, replace=False))
        emb = RowSparse(torch.from_numpy(rows), torch.from_numpy(rng.normal(size=(40, 32)).astype(np.float32)),
                        (4000, 32))
    return [emb, torch.from_numpy(rng.normal(size=(256, 128)).astype(np.float32)),
            torch.from_numpy(rng.normal(size=128).astype(np.float32))]


@pytest.mark.parametrize("flag", [f"auto:warmup=2,{SLOW}", "auto:warmup=2"], ids=["declared", "probed"])
def test_ranks_agree_although_their_statistics_differ(hvd, flag):
    policy, comm = AutoPolicy(flag), HorovodCommunicator(hvd)
    contexts = [TensorContext(n, s, 0, hvd.size()) for n, s in
                (("emb", (4000, 32)), ("w", (256, 128)), ("b", (128,)))]
    for step in range(2):
        policy.end_step(list(zip(local_gradients(hvd.rank(), step), contexts)), comm)
    chosen = [str(policy.compressor(ctx)) for ctx in contexts]
    assert not policy.pending and agreed(hvd, "|".join(chosen))
    table = policy.assignment
    assert agreed(hvd, repr([(r.tensor, r.compressor, r.density, r.bytes) for r in table]))
    # the maximum over ranks counts: rank 0's dense embedding rules out the sparse methods everywhere
    assert table[0].density == 1.0 and chosen[0].split(":")[0] not in ("topk", "sketch")
    assert comm.stats.bytes_sent == 0  # the policy's own collectives are not gradient bytes


def test_auto_prices_union_and_balanced_from_the_ranks_union_not_its_bound(hvd):
    """Ranks sharing rows: the union is what their bitmaps OR to, not the sum of their densities; rows
    no rank shares: the sum itself; a tensor dense somewhere: its bound, no bitmap sent."""
    from hvdsketch.collectives import side_channel
    from hvdsketch.policy.auto import measured_union

    size, rank = hvd.size(), hvd.rank()
    contexts = [TensorContext(n, (1000, 4), 0, size) for n in ("shared", "disjoint", "dense")]
    shared = RowSparse(torch.arange(0, 100, 2), torch.ones(50, 4), (1000, 4))  # the same 50 rows on every rank
    disjoint = RowSparse(torch.arange(10) + 10 * rank, torch.ones(10, 4), (1000, 4))
    bound = [size * 0.05, size * 0.01, 1.5]
    union = measured_union(side_channel(HorovodCommunicator(hvd)), [shared, disjoint, torch.ones(1000, 4)],
                           contexts, bound)
    assert union == pytest.approx([0.05, size * 0.01, 1.5])


class Scripted(Policy):
    """The reference: for ``warmup`` steps dense (a row-sparse gradient by allgather, as auto warms
    up), then fixed compressors by name, each its own instance."""

    def __init__(self, warmup: int, flags: dict[str, str]) -> None:
        self.warmup, self.steps = warmup, 0
        self.scripted = {name: create(flag) for name, flag in flags.items()}

    def compressor(self, ctx):
        if self.steps < self.warmup:
            return create("allgather" if ctx.row_sparse else "none")
        return self.scripted[ctx.name]

    def end_step(self, inputs, communicator, traced=False):
        self.steps += 1

    def __str__(self) -> str:
        return "scripted"


def train(hvd, compression, steps: int = 10):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(2000, 16, sparse=True), torch.nn.Flatten(),
                                torch.nn.Linear(16 * 8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))
    optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                     compression=compression)
    rng = np.random.default_rng(hvd.rank())
    for _ in range(steps):
        tokens = torch.from_numpy(rng.integers(0, 2000, size=(16, 8)))
        labels = torch.from_numpy(rng.integers(0, 5, size=16))
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(tokens), labels).backward()
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), optimizer.report()


def test_training_through_auto_is_the_announced_exchange(hvd):
    params, report = train(hvd, f"auto:warmup=3,{SLOW}")
    decided = {row["tensor"]: row["compressor"] for row in report["assignment"]}
    assert set(decided) == {"0.weight", "2.weight", "2.bias", "4.weight", "4.bias"}
    assert decided["0.weight"].split(":")[0] in ("allgather", "union", "balanced", "topk", "sketch", "powersgd")  # compressed
    assert any(flag != "none" for name, flag in decided.items() if name != "0.weight")
    reference, _ = train(hvd, Scripted(3, decided))
    if hvd.size() == 2:  # a + b: Horovod's allreduces sum alike however it fuses them, bit for bit
        assert torch.equal(params, reference)
    else:  # Horovod fuses allreduces as they come, which at 3 ranks changes the sums' order (unfused, they match)
        torch.testing.assert_close(params, reference, rtol=1e-5, atol=1e-6)
    gathered = hvd.allgather(params[None, :], name="policy.replicas")
    assert all(torch.equal(gathered[0], row) for row in gathered)
    assert report["bytes_sent"] < report["bytes_dense_allreduce"]


def test_training_through_rules_matches_dense_where_exact(hvd):
    """top-k keeping every coordinate is exact: training matches dense allreduce to rounding."""
    rules = {"rules": [{"name": "0.*", "compression": "topk:ratio=1"}, {"ndim": 1, "compression": "none"}],
             "default": "none"}
    params, report = train(hvd, rules)
    reference, _ = train(hvd, "none")
    torch.testing.assert_close(params, reference, rtol=1e-5, atol=1e-6)
    if hvd.rank() == 0:  # the rank that prints and records measures the matched tensors
        assert [row["tensor"] for row in report["assignment"]] == ["0.weight", "2.bias", "4.bias"]
