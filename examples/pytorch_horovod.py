"""A plain Horovod PyTorch training script; hvdsketch changes one line: ``compression=``.

    horovodrun -np 2 -H localhost:2 python examples/pytorch_horovod.py --compression sketch

Trains a bag-of-words classifier on synthetic documents (``examples/synthetic.py``) with Horovod's
habits: ``hvd.init()``, the learning rate scaled by the number of ranks, parameters and optimizer
state broadcast from rank 0, each rank its own shard of the data, losses averaged across ranks for
printing, a checkpoint written by rank 0 only. The embedding's gradient is dense, as most scripts
have it, so Horovod hands it to the compression. ``--compression`` takes several flags to train
once with each in one launch (every drop-in compressor: ``none fp16 sketch randomk:ratio=0.5``).
"""
import argparse
import os

import horovod.torch as hvd
import torch
from synthetic import VOCAB, documents

import hvdsketch.torch

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--compression", nargs="+", default=["sketch"], help="hvdsketch drop-in flags")
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--lr", type=float, default=0.005)
parser.add_argument("--checkpoint-dir", default="./checkpoints")
args = parser.parse_args()


def train(flag: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 16), torch.nn.Flatten(), torch.nn.Linear(6 * 16, 32),
                                torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * hvd.size())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    compression = hvdsketch.torch.Compression.from_spec(flag)  # was: hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)

    words, labels = (torch.from_numpy(a) for a in documents(hvd.rank()))
    losses = []
    for step in range(args.steps):
        batch = slice(step * args.batch_size % len(words), None)
        x, y = words[batch][:args.batch_size], labels[batch][:args.batch_size]
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(hvd.allreduce(loss.detach(), name="loss").item())  # the average over ranks

    if hvd.rank() == 0:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                   os.path.join(args.checkpoint_dir, f"pytorch-{flag.replace(':', '_')}.pt"))
        report = compression.report()
        first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
        print(f"{flag}: loss {first:.3f} -> {last:.3f}; sent {report['bytes_sent'] / 1e6:.3f} MB for "
              f"{report['bytes_dense'] / 1e6:.3f} MB of gradients ({report['ratio']:.1f}x less)", flush=True)


hvd.init()
torch.set_num_threads(1)
for flag in args.compression:
    train(flag)
