"""What the DDP hook's tests share: a model with a sparse (or dense) embedding, each rank's own
batches, DDP with small buckets (several per step, the sparse gradient in its own), training steps."""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from hvdsketch.torch.ddp import ExchangeState, exchange_hook

VOCAB, WIDTH, TOKENS, CLASSES = 300, 8, 4, 5
#: Small enough that DDP splits the dense layers into several buckets.
BUCKET_MB = 0.002


def model(sparse: bool = True, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(VOCAB, WIDTH, sparse=sparse), torch.nn.Flatten(),
                               torch.nn.Linear(TOKENS * WIDTH, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32),
                               torch.nn.ReLU(), torch.nn.Linear(32, CLASSES))


def batches(steps: int, batch: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's batches (each rank its own, the same in every run)."""
    rng = np.random.default_rng([dist.get_rank(), 7])
    return [(torch.from_numpy(rng.integers(0, VOCAB, size=(batch, TOKENS))),
             torch.from_numpy(rng.integers(0, CLASSES, size=batch))) for _ in range(steps)]


def ddp(module: torch.nn.Module, compression: str | None = None, **kwargs) -> tuple[torch.nn.Module, ExchangeState | None]:
    """``module`` in DDP, with hvdsketch's hook for ``compression`` (DDP's own allreduce for ``None``)."""
    wrapped = torch.nn.parallel.DistributedDataParallel(module, bucket_cap_mb=BUCKET_MB)
    if compression is None:
        return wrapped, None
    state = ExchangeState(wrapped, compression=compression, **kwargs)
    wrapped.register_comm_hook(state, exchange_hook)
    return wrapped, state


def loss(wrapped: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    tokens, labels = batch
    return torch.nn.functional.cross_entropy(wrapped(tokens), labels)


def train(wrapped: torch.nn.Module, optimizer: torch.optim.Optimizer, data) -> None:
    for batch in data:
        optimizer.zero_grad()
        loss(wrapped, batch).backward()
        optimizer.step()


def sgd(module: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)


def flat(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def trained(compression: str | None, sparse: bool = True, steps: int = 4, **kwargs) -> tuple[torch.Tensor, ExchangeState | None]:
    """The parameters after ``steps`` steps of SGD with momentum, and the hook's state."""
    module = model(sparse)
    wrapped, state = ddp(module, compression, **kwargs)
    train(wrapped, sgd(module), batches(steps))
    return flat(module), state


def assert_replicas_agree(module: torch.nn.Module) -> None:
    mine = flat(module)
    assert bool(torch.isfinite(mine).all())
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    assert all(torch.equal(every[0], theirs) for theirs in every)


def counting(monkeypatch) -> dict[str, int]:
    """The calls of the real all_gather and all_reduce from here on, counted."""
    calls = {"all_gather": 0, "all_reduce": 0}

    def counted(name, real):
        def call(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return call

    for name in calls:
        monkeypatch.setattr(dist, name, counted(name, getattr(dist, name)))
    return calls
