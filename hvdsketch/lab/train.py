"""Train a workload from a YAML config under ``horovodrun`` (or ``mpirun``).

::

    horovodrun -np 2 -H localhost:2 hvdsketch train --config configs/lstm.yaml --compression sketch

Rank 0 shows a progress bar per epoch, validates after each epoch, prints a
summary of quality, time and bytes sent against dense allreduce, and writes a
JSON record of the run. ``path: hvdsketch`` (default) uses
:func:`hvdsketch.torch.DistributedOptimizer`; ``path: horovod`` uses Horovod's
own optimizer with the drop-in compression, as a user's unchanged script would;
``path: local`` exchanges nothing (each rank trains alone: the limit a step's
time can reach). The summary says where a step's time went
(:mod:`hvdsketch.lab.breakdown`: compute, codec, wait, update).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from hvdsketch import spec
from hvdsketch.lab import breakdown
from hvdsketch.lab.config import TrainConfig
from hvdsketch.policy import label


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config (keys: " +
                        ", ".join(f.name for f in dataclasses.fields(TrainConfig)) + ")")
    parser.add_argument("--workload", help="workload flag, e.g. lstm:batch_size=20 (overrides the config)")
    parser.add_argument("--compression", help="compression flag, e.g. sketch:error=0.5 "
                        f"(overrides ${spec.ENV_VAR} and the config)")
    parser.add_argument("--memory", help="residual memory flag, e.g. fp32 or plan:budget=0.25")
    parser.add_argument("--path", choices=["hvdsketch", "horovod", "local"],
                        help="whose DistributedOptimizer (local: none, no exchange)")
    parser.add_argument("--collectives", choices=["horovod", "mpi"],
                        help="path hvdsketch (PyTorch): Horovod's collectives (default) or hvdsketch's MPI layer")
    parser.add_argument("--sparse-as-dense", choices=["true", "false"],
                        help="path horovod: allreduce sparse gradients dense (true, default) or let Horovod "
                             "allgather their indices and values (false; PyTorch only)")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--steps-per-epoch", type=int, help="cap the steps of each epoch (quick runs)")
    parser.add_argument("--out", help="folder for the JSON record (default runs/)")


def run(args: argparse.Namespace) -> int:
    config = TrainConfig.load(args.config, workload=args.workload, compression=args.compression,
                              memory=args.memory, path=args.path, collectives=args.collectives, epochs=args.epochs,
                              sparse_as_dense=None if args.sparse_as_dense is None else args.sparse_as_dense == "true",
                              steps_per_epoch=args.steps_per_epoch, out=args.out)
    from hvdsketch.lab.workloads import get

    workload = get(config.workload)
    if getattr(workload, "framework", "torch") == "tensorflow":
        from hvdsketch.lab.train_tf import train
    else:
        from hvdsketch.lab.train_torch import train
    record = train(config, workload)
    if record["rank"] == 0:
        print_summary(record)
        out = Path(config.out)
        out.mkdir(parents=True, exist_ok=True)
        name = f"{workload.name}-{label(config.compression)}-np{record['size']}-{int(time.time())}.json"
        (out / name).write_text(json.dumps(record, indent=2))
        print(f"record: {out / name}")
    return 0


def print_summary(record: dict[str, Any]) -> None:
    quality = ", ".join(f"{k} {v:.4g}" for k, v in record["validation"][-1].items())
    sent, dense = record["bytes_sent_per_step"], record["bytes_dense_per_step"]
    print(f"\n== {record['workload']} | {record['compression']} | {record['size']} ranks | "
          f"{record['path']} path")
    parts = breakdown.of(record)
    split = ("parts not timed apart: tf.function, or DDP's own hooks" if parts is None else
             ", ".join(f"{part} {1000 * seconds:.1f}" for part, seconds in parts.items() if seconds is not None) + " ms")
    print(f"   epochs {record['epochs']}, steps {record['steps']}, wall {record['wall_s']:.1f} s, "
          f"step {1000 * record['step_s']:.1f} ms ({split})")
    print(f"   validation: {quality}")
    if record["path"] == "local":
        print("   no exchange: each rank trained alone on its batches (path local)")
    else:
        print(f"   bytes sent per step {sent / 1e6:.3f} MB vs dense allreduce {dense / 1e6:.3f} MB "
              f"({dense / sent if sent else float('nan'):.2f}x less)")
