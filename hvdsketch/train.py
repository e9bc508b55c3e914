"""Train a workload from a YAML config under ``horovodrun`` (or ``mpirun``).

::

    horovodrun -np 2 -H localhost:2 hvdsketch train --config configs/lstm.yaml --compression sketch

Rank 0 shows a progress bar per epoch, validates after each epoch, prints a
summary of quality, time and bytes sent against dense allreduce, and writes a
JSON record of the run. ``path: hvdsketch`` (default) uses
:func:`hvdsketch.torch.DistributedOptimizer`; ``path: horovod`` uses Horovod's
own optimizer with the drop-in compression, as a user's unchanged script would.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from hvdsketch import spec
from hvdsketch.policy import label
from hvdsketch.spec import SpecError


@dataclass(frozen=True)
class TrainConfig:
    """The keys of a training YAML config."""

    workload: str
    compression: str | dict | list = "none"  # a flag, or per-tensor rules (hvdsketch.policy)
    memory: str | None = None
    path: Literal["hvdsketch", "horovod"] = "hvdsketch"
    epochs: int = 1
    steps_per_epoch: int | None = None
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = 0.1
    momentum: float = 0.0
    clip: float | None = None
    sparse_as_dense: bool = True  # path horovod: densify sparse gradients (False: Horovod allgathers them)
    out: str = "runs"

    @classmethod
    def load(cls, config_file: str | None, **overrides: Any) -> "TrainConfig":
        path = config_file
        raw = yaml.safe_load(Path(path).read_text()) if path else {}
        if not isinstance(raw, dict):
            raise SpecError(f"{path}: a config must be a mapping of keys, got {type(raw).__name__}")
        valid = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - valid)
        if unknown:
            raise SpecError(f"{path}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(sorted(valid))}")
        raw["compression"] = spec.resolve(None, overrides.pop("compression", None), raw)
        raw.update({k: v for k, v in overrides.items() if v is not None})
        if "workload" not in raw:
            raise SpecError("a config needs a workload, e.g. 'workload: lstm' (or --workload)")
        return cls(**raw)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config (keys: " +
                        ", ".join(f.name for f in dataclasses.fields(TrainConfig)) + ")")
    parser.add_argument("--workload", help="workload flag, e.g. lstm:batch_size=20 (overrides the config)")
    parser.add_argument("--compression", help="compression flag, e.g. sketch:error=0.5 "
                        f"(overrides ${spec.ENV_VAR} and the config)")
    parser.add_argument("--memory", help="residual memory flag, e.g. fp32 or plan:budget=0.25")
    parser.add_argument("--path", choices=["hvdsketch", "horovod"], help="whose DistributedOptimizer")
    parser.add_argument("--sparse-as-dense", choices=["true", "false"],
                        help="path horovod: allreduce sparse gradients dense (true, default) or let Horovod "
                             "allgather their indices and values (false; PyTorch only)")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--steps-per-epoch", type=int, help="cap the steps of each epoch (quick runs)")
    parser.add_argument("--out", help="folder for the JSON record (default runs/)")


def run(args: argparse.Namespace) -> int:
    config = TrainConfig.load(args.config, workload=args.workload, compression=args.compression,
                              memory=args.memory, path=args.path, epochs=args.epochs,
                              sparse_as_dense=None if args.sparse_as_dense is None else args.sparse_as_dense == "true",
                              steps_per_epoch=args.steps_per_epoch, out=args.out)
    from hvdsketch.workloads import get

    workload = get(config.workload)
    if getattr(workload, "framework", "torch") == "tensorflow":
        from hvdsketch.train_tf import train
    else:
        from hvdsketch.train_torch import train
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
    exchange = ("not timed apart: tf.function or DDP" if record["exchange_s"] is None
                else f"exchange {1000 * record['exchange_s']:.1f} ms")
    print(f"   epochs {record['epochs']}, steps {record['steps']}, wall {record['wall_s']:.1f} s, "
          f"step {1000 * record['step_s']:.1f} ms ({exchange})")
    print(f"   validation: {quality}")
    print(f"   bytes sent per step {sent / 1e6:.3f} MB vs dense allreduce {dense / 1e6:.3f} MB "
          f"({dense / sent if sent else float('nan'):.2f}x less)")


def environment() -> dict[str, Any]:
    """Where the run ran, for its record."""
    return {"host": os.uname().nodename, "cpus": os.cpu_count(), "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
