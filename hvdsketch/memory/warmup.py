"""Warm-up statistics: what each candidate store would lose of each tensor's residual, and its time.

During a short warm-up with full error feedback, every residual ``e`` is
put into each candidate store and taken back (one round trip, on the
tensor's own back-end and device), recording

* ``||e||^2``, the residual's energy, every step;
* ``||e - take(put(e))||^2``, the energy the store loses;
* the seconds its ``put`` and ``take`` took.

The ``shared`` store's loss depends on the other tensors of its shape, so
the planner derives it from the per-step energies: one step of a shared
buffer keeps the group's largest residual and loses the rest.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from hvdsketch.memory.stores import Store
from hvdsketch.ops import backend


@dataclass
class TensorStats:
    """Warm-up statistics of one tensor, summed over the observed steps."""

    shape: tuple[int, ...]
    #: ``||e||^2`` of each observed step.
    energies: list[float] = field(default_factory=list)
    #: candidate flag -> lost energy, summed over the steps.
    lost: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    #: candidate flag -> seconds in ``put`` and ``take``, summed over the steps.
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    #: False when the tensor lives on an accelerator, where ``offload`` saves device memory.
    on_host: bool = True

    @property
    def steps(self) -> int:
        return len(self.energies)

    def to_arrays(self) -> dict[str, Any]:
        return {"shape": np.asarray(self.shape, dtype=np.int64), "energies": np.asarray(self.energies),
                "on_host": np.asarray(self.on_host), "lost": {k: np.asarray(v) for k, v in self.lost.items()},
                "seconds": {k: np.asarray(v) for k, v in self.seconds.items()}}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, Any]) -> "TensorStats":
        return cls(tuple(int(d) for d in arrays["shape"]), [float(e) for e in arrays["energies"]],
                   defaultdict(float, {k: float(v) for k, v in arrays["lost"].items()}),
                   defaultdict(float, {k: float(v) for k, v in arrays["seconds"].items()}),
                   bool(arrays["on_host"]))


class Warmup:
    """Collects :class:`TensorStats` by running every candidate store on observed residuals."""

    def __init__(self, candidates: Sequence[Store]) -> None:
        self.candidates = list(candidates)
        self.stats: dict[str, TensorStats] = {}

    def observe(self, name: str, residual: Any) -> None:
        """Record one step's ``residual`` of tensor ``name``."""
        ops = backend(residual)
        stats = self.stats.get(name)
        if stats is None:
            stats = self.stats[name] = TensorStats(ops.shape(residual), on_host=ops.device_name(residual) == "cpu")
        energy = ops.sqnorm(residual)
        stats.energies.append(energy)
        for store in self.candidates:
            key = str(store)
            start = time.perf_counter()
            back = store.take(ops, store.put(ops, None, residual, name), name, residual)[0] if store.keeps else None
            stats.seconds[key] += time.perf_counter() - start
            stats.lost[key] += energy if back is None else ops.sqnorm(residual - back)

    def observe_all(self, residuals: Mapping[str, Sequence[Any]]) -> None:
        """Record every tensor's residual samples, step by step in the order given."""
        steps = max((len(samples) for samples in residuals.values()), default=0)
        for step in range(steps):
            for name, samples in residuals.items():
                if step < len(samples):
                    self.observe(name, samples[step])

    def state_dict(self) -> dict[str, Any]:
        return {name: stats.to_arrays() for name, stats in self.stats.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.stats = {name: TensorStats.from_arrays(arrays) for name, arrays in state.items()}
