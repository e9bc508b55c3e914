"""The keys of a training YAML config (``hvdsketch train --config``), and where a run ran."""
from __future__ import annotations

import dataclasses
import os
import time
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
    memory: str | None = None
    path: Literal["hvdsketch", "horovod"] = "hvdsketch"
    collectives: Literal["horovod", "mpi"] = "horovod"  # path hvdsketch: whose collectives move the messages
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


def environment() -> dict[str, Any]:
    """Where the run ran, for its record."""
    return {"host": os.uname().nodename, "cpus": os.cpu_count(), "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
