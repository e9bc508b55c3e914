"""A plain PyTorch FSDP2 training script; hvdsketch adds one line after ``fully_shard``.

    torchrun --nproc_per_node 2 examples/fsdp_lm.py --compression auto

Trains a small transformer language model (untied input and output embeddings, a vocabulary of
which each batch touches few rows) on synthetic token streams (a fixed random next-token table,
so the loss falls in a few dozen steps), with FSDP2's habits: ``init_process_group`` from
torchrun's environment, ``fully_shard`` on the embedding, on each block and on the model, each
rank its own data, Adam on the sharded parameters, losses averaged across ranks for printing,
and a distributed checkpoint (``torch.distributed.checkpoint``) of the model, the optimizer and
hvdsketch's state, each rank writing its own shards. ``--compression`` takes several flags to
train once with each in one launch (``none fp16:dtype=bfloat16 quantize rows auto``, any flag of
:mod:`hvdsketch.torch.fsdp`). Runs on CPU over gloo; on GPUs, initialise the process group with
NCCL and build the model on the rank's device: hvdsketch's line stays the same.
"""
import argparse
import gc
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.fsdp import fully_shard

import hvdsketch.torch.fsdp

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--compression", nargs="+", default=["auto"], help="hvdsketch reduce-scatter flags")
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--context", type=int, default=16)
parser.add_argument("--vocab", type=int, default=4096)
parser.add_argument("--common", type=int, default=256, help="the tokens the streams use")
parser.add_argument("--width", type=int, default=64)
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--checkpoint-dir", default="./checkpoints")
args = parser.parse_args()


class Block(torch.nn.Module):
    def __init__(self, width: int, heads: int = 4) -> None:
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.attention = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        causal = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        h = self.norm1(x)
        x = x + self.attention(h, h, h, attn_mask=causal, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class LM(torch.nn.Module):
    def __init__(self, vocab: int, width: int, context: int, blocks: int = 2) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.position = torch.nn.Parameter(torch.zeros(context, width))
        self.blocks = torch.nn.ModuleList(Block(width) for _ in range(blocks))
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab, bias=False)  # untied from the embedding

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[:tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)).flatten(0, 1)


def streams(rank: int, count: int) -> torch.Tensor:
    """``count`` token streams of ``context + 1`` tokens: each next token follows from the one before by
    a fixed random table over the ``common`` tokens (the same table on every rank), each rank its own starts."""
    table = np.random.default_rng(0).integers(0, args.common, size=args.common)
    rng = np.random.default_rng([1, rank])
    tokens = np.empty((count, args.context + 1), dtype=np.int64)
    tokens[:, 0] = rng.integers(0, args.common, size=count)
    for t in range(args.context):
        noise = rng.random(count) < 0.1
        tokens[:, t + 1] = np.where(noise, rng.integers(0, args.common, size=count), table[tokens[:, t]])
    return torch.from_numpy(tokens)


def train(flag: str) -> None:
    torch.manual_seed(0)
    model = LM(args.vocab, args.width, args.context)
    fully_shard(model.embed)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    reduction = hvdsketch.torch.fsdp.compress(model, compression=flag)  # the one change
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    data = streams(dist.get_rank(), args.steps * args.batch_size)
    losses = []
    for step in range(args.steps):
        batch = data[step * args.batch_size:(step + 1) * args.batch_size]
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(batch[:, :-1]), batch[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        average = loss.detach().clone()
        dist.all_reduce(average)
        losses.append(average.item() / dist.get_world_size())

    # every rank writes its own shards, and hvdsketch's state of its own rank
    dcp.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "hvdsketch": reduction},
             checkpoint_id=os.path.join(args.checkpoint_dir, f"fsdp-{flag.replace(':', '_')}"))
    if dist.get_rank() == 0:
        report = reduction.report()
        first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
        print(f"{flag}: loss {first:.3f} -> {last:.3f}; sent {report['bytes_sent'] / 1e6:.3f} MB for "
              f"{report['bytes_dense_reduce_scatter'] / 1e6:.3f} MB of FSDP's own reduce-scatter", flush=True)


dist.init_process_group("gloo")
torch.set_num_threads(1)
for flag in args.compression:
    train(flag)
gc.collect()
dist.destroy_process_group()
