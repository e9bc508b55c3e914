"""What the FSDP front end's tests share: a small transformer-shaped LM sharded per block, each
rank's own batches, and training steps with FSDP's own reduce-scatter or hvdsketch's."""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import hvdsketch.torch.fsdp

#: 30 hidden units: at 4 ranks FSDP pads the blocks' first layers (30 rows in blocks of 8).
VOCAB, WIDTH, HIDDEN, TOKENS = 96, 16, 30, 6


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.up, self.down = torch.nn.Linear(WIDTH, HIDDEN), torch.nn.Linear(HIDDEN, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class LM(torch.nn.Module):
    """An embedding whose gradient touches few rows, two blocks and an untied output layer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x.reshape(-1, WIDTH))  # a tensor of its own, not a view (FSDP's root output)


def model(seed: int = 0) -> LM:
    torch.manual_seed(seed)
    return LM()


def sharded(module: LM, compression: str | None = None, reduce_dtype: torch.dtype | None = None,
            **kwargs) -> tuple[LM, "hvdsketch.torch.fsdp.FSDPReduction | None"]:
    """``module`` sharded per block and at its root (which holds the output layer), with
    hvdsketch's reduce-scatter for ``compression`` (FSDP's own for ``None``)."""
    policy = MixedPrecisionPolicy(reduce_dtype=reduce_dtype)
    for part in (module.embed, *module.blocks):
        fully_shard(part, mp_policy=policy, **kwargs.pop("fsdp", {}))
    fully_shard(module, mp_policy=policy)
    if compression is None:
        return module, None
    return module, hvdsketch.torch.fsdp.compress(module, compression, **kwargs)


def batches(steps: int, batch: int = 4, rows: int = VOCAB // 4) -> list[torch.Tensor]:
    """This rank's token batches (each rank its own, the same in every run), drawn from the first
    ``rows`` of the vocabulary."""
    rng = np.random.default_rng([dist.get_rank(), 11])
    return [torch.from_numpy(rng.integers(0, rows, size=(batch, TOKENS + 1))) for _ in range(steps)]


def loss(module: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    logits = module(batch[:, :-1])
    return torch.nn.functional.cross_entropy(logits, batch[:, 1:].reshape(-1))


def step(module: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor) -> None:
    optimizer.zero_grad()
    loss(module, batch).backward()
    optimizer.step()


def adam(module: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(module.parameters(), lr=1e-2)


def local(module: torch.nn.Module) -> torch.Tensor:
    """This rank's shards of every parameter, flat."""
    return torch.cat([p.detach().to_local().reshape(-1) for p in module.parameters()])


def gradients(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's whole averaged gradient (gathered from the shards: collective)."""
    return {name: p.grad.full_tensor() for name, p in module.named_parameters()}


def exact_gradients(batch: torch.Tensor, seed: int = 0) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Every parameter's average gradient over the ranks' ``batch``, and the mean over ranks of its
    magnitude, in float64, from an unsharded copy of the model."""
    plain = model(seed)
    loss(plain, batch).backward()
    average, magnitude = {}, {}
    for name, p in plain.named_parameters():
        every = [torch.empty_like(p.grad) for _ in range(dist.get_world_size())]
        dist.all_gather(every, p.grad)
        stacked = torch.stack(every).double()
        average[name], magnitude[name] = stacked.mean(0), stacked.abs().mean(0)
    return average, magnitude
