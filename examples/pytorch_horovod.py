"""A plain Horovod PyTorch training script. hvdsketch changes one line: ``compression=``.

    horovodrun -np 2 -H localhost:2 python examples/pytorch_horovod.py --compression sketch:error=0.5

Trains the word-level LSTM language model (King James Bible) for a few
steps, with the embedding's gradient dense, as most scripts have it, so that
Horovod hands it to the compression.
"""
import argparse

import horovod.torch as hvd
import torch

import hvdsketch.torch
from hvdsketch.lab.workloads import get

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--compression", default="sketch:error=0.5")
parser.add_argument("--steps", type=int, default=50)
parser.add_argument("--lr", type=float, default=1.0)
args = parser.parse_args()

hvd.init()
torch.set_num_threads(1)
workload = get("lstm:sparse=false,vocab_size=5000,hidden=128,embed_dim=128")
model = workload.build_model()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)

compression = hvdsketch.torch.Compression.from_spec(args.compression)  # was: hvd.Compression.none
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=compression)

first = last = None
for step, batch in zip(range(args.steps), workload.train_batches(0, hvd.rank(), hvd.size())):
    optimizer.zero_grad()
    loss = workload.loss(model, batch)
    loss.backward()
    optimizer.step()
    first = loss.item() if first is None else first
    last = loss.item()
    if hvd.rank() == 0 and step % 10 == 0:
        print(f"step {step:4d}  loss {last:.3f}", flush=True)

if hvd.rank() == 0:
    report = compression.report()
    print(f"loss {first:.3f} -> {last:.3f}; {report['compression']}: sent {report['bytes_sent'] / 1e6:.2f} MB "
          f"for {report['bytes_dense'] / 1e6:.2f} MB of gradients ({report['ratio']:.1f}x less)")
