"""The keys of a training YAML config (``hvdsketch train --config``), and where a run ran.

Every key is checked when the config is made, on every rank alike and before any training: its
type (YAML text such as ``1e-3`` is converted), its range, and whether the chosen path would use
it. A key that would be ignored (``memory`` on Horovod's own optimizer) is an error, never a
setting the record lists but the run did not have.
"""
from __future__ import annotations

import dataclasses
import os
import time
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from hvdsketch import spec
from hvdsketch.spec import SpecError


@dataclass(frozen=True)
class TrainConfig:
    """The keys of a training YAML config."""

    workload: str
    compression: str | dict | list = "none"  # a flag, or per-tensor rules (hvdsketch.policy)
    memory: str | None = None  # residual memory flag (error feedback); path hvdsketch only
    # local: no exchange at all, each rank trains alone on its batches (the limit a step's time can reach)
    path: Literal["hvdsketch", "horovod", "local"] = "hvdsketch"
    collectives: Literal["horovod", "mpi"] = "horovod"  # path hvdsketch: whose collectives move the messages
    epochs: int = 1
    steps_per_epoch: int | None = None
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = 0.1
    momentum: float = 0.0  # optimizer sgd only
    clip: float | None = None  # bound on the global L2 norm of the averaged gradients
    # densify sparse gradients before the exchange; unset: true on path horovod (false: Horovod
    # allgathers them), false on path hvdsketch (its compressors take them sparse)
    sparse_as_dense: bool | None = None
    out: str = "runs"

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for field in dataclasses.fields(self):
            value = spec.coerce(getattr(self, field.name), hints[field.name], f"config key {field.name!r}")
            object.__setattr__(self, field.name, value)
        problem = next(self._problems(), None)  # the first; checking the flags comes last
        if problem is not None:
            raise SpecError(f"config: {problem}")

    def _problems(self) -> typing.Iterator[str]:
        """What is out of range, or would be ignored by the chosen path."""
        from hvdsketch import compress, memory, policy

        if not self.workload.strip():
            yield "workload is empty; e.g. 'workload: lstm'"
        if self.epochs < 1:
            yield f"epochs must be >= 1, got {self.epochs}"
        if self.steps_per_epoch is not None and self.steps_per_epoch < 1:
            yield f"steps_per_epoch must be >= 1 (or left out for whole epochs), got {self.steps_per_epoch}"
        if not self.lr > 0:
            yield f"lr must be > 0, got {self.lr}"
        if not 0 <= self.momentum < 1:
            yield f"momentum must be in [0, 1), got {self.momentum}"
        if self.momentum and self.optimizer != "sgd":
            yield f"momentum applies to optimizer sgd only; {self.optimizer} would ignore it"
        if self.clip is not None and not self.clip > 0:
            yield f"clip must be > 0 (or left out for no clipping), got {self.clip}"
        if not self.out.strip():
            yield "out is empty; e.g. 'out: runs'"
        if self.path == "local" and (self.compression != "none" or self.memory is not None):
            yield ("path local exchanges nothing, so it takes compression none and no memory (the config has "
                   f"compression {self.compression!r}, memory {self.memory!r})")
        if self.path == "horovod":
            if self.memory is not None:
                yield ("memory needs path hvdsketch: Horovod's own optimizer keeps no residuals, so "
                       f"memory {self.memory!r} would be ignored")
            if not isinstance(self.compression, str):
                yield "path horovod takes one compressor flag (Horovod's compression=), not per-tensor rules"
            elif spec.Spec.parse(self.compression).name == "auto":
                yield "auto chooses per tensor and needs path hvdsketch; path horovod takes one compressor flag"
            elif not compress.create(self.compression).one_message().drop_in:
                yield (f"{self.compression!r} needs more than one averaged allreduce, which Horovod's own "
                       f"optimizer cannot run; use path hvdsketch")
        policy.create(self.compression)  # a bad flag or rule raises its SpecError here, on every rank
        if self.memory is not None:
            memory.create(self.memory)

    @property
    def densify(self) -> bool:
        """Whether sparse gradients are densified before the exchange (``sparse_as_dense`` or its default)."""
        return self.path == "horovod" if self.sparse_as_dense is None else self.sparse_as_dense

    @classmethod
    def load(cls, config_file: str | None, **overrides: Any) -> "TrainConfig":
        path = config_file
        raw = yaml.safe_load(Path(path).read_text()) if path else {}
        raw = dict(spec.known_keys(raw, sorted(f.name for f in dataclasses.fields(cls)), f"{path}: a config"))
        raw["compression"] = spec.resolve(None, overrides.pop("compression", None), raw)
        raw.update({k: v for k, v in overrides.items() if v is not None})
        if "workload" not in raw:
            raise SpecError("a config needs a workload, e.g. 'workload: lstm' (or --workload)")
        return cls(**raw)


def agree(config: TrainConfig, hvd: Any) -> None:
    """Fail alike on every rank unless every rank runs the same resolved config (every key but
    ``out``, where rank 0 alone writes): one ``hvd.allgather_object`` of it, before any model or
    optimizer is made, so that ranks on different paths (``hvdsketch`` and ``horovod``) meet here
    rather than in collectives of different names, and ranks with different ``lr``, ``optimizer`` or
    ``clip`` do not train replicas that drift apart."""
    from hvdsketch.exchange.agreement import difference

    mine = {f"config key {key!r}": value for key, value in dataclasses.asdict(config).items() if key != "out"}
    differs = difference(hvd.allgather_object(mine, name="hvdsketch.train.config"))
    if differs:
        raise SpecError(f"config: ranks run different configs: {differs}; give every rank the same --config "
                        f"file, options and {spec.ENV_VAR}")


def environment() -> dict[str, Any]:
    """Where the run ran, for its record."""
    return {"host": os.uname().nodename, "cpus": os.cpu_count(), "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
