"""A plain PyTorch DDP training script; hvdsketch changes one line: the communication hook.

    torchrun --nproc_per_node 2 examples/pytorch_ddp.py --compression sketch

Trains a bag-of-words classifier on synthetic documents (``examples/synthetic.py``) with DDP's
habits: ``init_process_group`` from torchrun's environment, one ``DistributedDataParallel`` model,
each rank its own shard of the data, losses averaged across ranks for printing, a checkpoint
written by rank 0. The embedding's gradient is sparse (``nn.Embedding(sparse=True)``): DDP gives
it a bucket of its own, and the hook exchanges it row-sparse (the sketch's case) and hands it back
sparse to SGD. No Horovod. ``--compression`` takes several flags to train once with each in one
launch (``none sketch allgather union powersgd:rank=2 auto``, any hvdsketch flag). Under
``mpirun``, set ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` for each rank as
torchrun does.

To resume every rank exactly, save the hook's state beside the model (``state.state_dict()`` on
every rank, the file on rank 0) and give it to ``state.load_state_dict`` on resume
(:mod:`hvdsketch.torch.ddp`).
"""
import argparse
import gc
import os

import torch
import torch.distributed as dist
from synthetic import VOCAB, documents

from hvdsketch.torch.ddp import ExchangeState, exchange_hook

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--compression", nargs="+", default=["sketch"], help="hvdsketch compression flags")
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--lr", type=float, default=0.5)
parser.add_argument("--checkpoint-dir", default="./checkpoints")
args = parser.parse_args()


def train(flag: str) -> None:
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 16, sparse=True), torch.nn.Flatten(),
                                 torch.nn.Linear(6 * 16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = torch.nn.parallel.DistributedDataParallel(module)
    model.register_comm_hook(state := ExchangeState(model, compression=flag), exchange_hook)  # the one change
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    words, labels = (torch.from_numpy(a) for a in documents(dist.get_rank()))
    losses = []
    for step in range(args.steps):
        batch = slice(step * args.batch_size % len(words), None)
        x, y = words[batch][:args.batch_size], labels[batch][:args.batch_size]
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        average = loss.detach().clone()
        dist.all_reduce(average)
        losses.append(average.item() / dist.get_world_size())

    if dist.get_rank() == 0:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        torch.save({"model": module.state_dict(), "optimizer": optimizer.state_dict()},
                   os.path.join(args.checkpoint_dir, f"ddp-{flag.replace(':', '_')}.pt"))
        report = state.report()
        first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
        print(f"{flag}: loss {first:.3f} -> {last:.3f}; sent {report['bytes_sent'] / 1e6:.3f} MB for "
              f"{report['bytes_dense_allreduce'] / 1e6:.3f} MB of a dense allreduce", flush=True)


dist.init_process_group("gloo")
torch.set_num_threads(1)
for flag in args.compression:
    train(flag)
# Each DDP model is garbage in a reference cycle once train() returns: free it while the process
# group lives (one freed at the interpreter's exit, after destroy_process_group, can abort it).
gc.collect()
dist.destroy_process_group()
