"""Warm-up statistics: how much of each tensor's residual each candidate store would lose, and its time.

Error feedback telescopes (Karimireddy et al., 2019), ``sum_t C(g_t + Q(e_t)) = sum_t g_t - sum_t (e_t -
Q(e_t)) - e_T``, so the parameters drift by the *accumulated* loss: a store's lost energy is
``||sum_t (e_t - Q(e_t))||^2 / T`` over the warm-up steps (no error feedback: ``||sum_t e_t||^2 / T``).
Each observed residual makes one round trip through every candidate on its own device; losses are kept at a
fixed random sample of at most :data:`SAMPLE` coordinates (scaled by ``n / m``). The planner derives
``shared``'s loss from the per-step samples and energies. Host syncs happen in warm-up steps only.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from hvdsketch.digests import crc
from hvdsketch.memory.stores import Store, numel
from hvdsketch.ops import backend

#: Coordinates per tensor at which losses are accumulated.
SAMPLE = 1 << 14


def sample_of(name: str, n: int) -> np.ndarray:
    """The sorted coordinates sampled from a tensor of ``n`` elements (all when ``n <= SAMPLE``)."""
    if n <= SAMPLE:
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(crc(name))
    return np.sort(rng.choice(n, SAMPLE, replace=False)).astype(np.int64)


@dataclass
class TensorStats:
    """Warm-up statistics of one tensor."""

    shape: tuple[int, ...]
    #: ``||e_t||^2`` of each observed step (all coordinates).
    energies: list[float] = field(default_factory=list)
    #: ``e_t`` at the sampled coordinates, each step (float32).
    samples: list[np.ndarray] = field(default_factory=list)
    #: candidate flag -> ``sum_t l_t`` at the sampled coordinates.
    lost: dict[str, np.ndarray] = field(default_factory=dict)
    #: candidate flag -> seconds in ``put`` and ``take``, summed over the steps.
    seconds: dict[str, float] = field(default_factory=dict)
    #: False when the tensor lives on an accelerator, where ``offload`` saves device memory.
    on_host: bool = True

    @property
    def steps(self) -> int:
        return len(self.samples)

    def drift(self, accumulated: np.ndarray) -> float:
        """``||sum_t l_t||^2 / T`` estimated from its sampled coordinates."""
        if not self.steps or not len(accumulated):
            return 0.0
        return numel(self.shape) / len(accumulated) * float(np.dot(accumulated, accumulated)) / self.steps

    def energy(self) -> float:
        """What no error feedback would lose: ``||sum_t e_t||^2 / T``."""
        return self.drift(np.sum(self.samples, axis=0, dtype=np.float64)) if self.samples else 0.0

    def lost_energy(self, store: Store) -> float:
        """What ``store`` loses: ``||sum_t (e_t - Q(e_t))||^2 / T``."""
        return self.drift(self.lost[str(store)]) if store.keeps else self.energy()

    def lost_unless(self, kept: Iterable[bool]) -> float:
        """What is lost when only the steps marked ``kept`` keep their residual (``shared``)."""
        dropped = [s for s, k in zip(self.samples, kept) if not k]
        return self.drift(np.sum(dropped, axis=0, dtype=np.float64)) if dropped else 0.0

    def to_arrays(self) -> dict[str, Any]:
        return {"shape": np.asarray(self.shape, dtype=np.int64), "energies": np.asarray(self.energies),
                "samples": np.asarray(self.samples), "on_host": np.asarray(self.on_host),
                "lost": dict(self.lost), "seconds": {k: np.asarray(v) for k, v in self.seconds.items()}}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, Any]) -> "TensorStats":
        return cls(tuple(int(d) for d in arrays["shape"]), [float(e) for e in arrays["energies"]],
                   list(arrays["samples"]), {k: np.asarray(v) for k, v in arrays["lost"].items()},
                   {k: float(v) for k, v in arrays["seconds"].items()}, bool(arrays["on_host"]))


class Warmup:
    """Collects :class:`TensorStats` by running every candidate store on observed residuals."""

    def __init__(self, candidates: Sequence[Store]) -> None:
        self.candidates = list(candidates)
        self.stats: dict[str, TensorStats] = {}
        self._index: dict[str, Any] = {}

    def observe(self, name: str, residual: Any) -> None:
        """Record one step's ``residual`` of tensor ``name``."""
        ops = backend(residual)
        stats = self.stats.get(name)
        if stats is None:
            stats = self.stats[name] = TensorStats(ops.shape(residual), on_host=ops.device_name(residual) == "cpu")
        if name not in self._index:
            self._index[name] = ops.from_numpy(sample_of(name, numel(stats.shape)), residual)
        index = self._index[name]

        def sampled(x: Any) -> np.ndarray:
            return ops.to_numpy(ops.cast(ops.gather(ops.flatten(x), index), "float64"))

        stats.energies.append(float(ops.to_numpy(ops.sqnorm(residual))))
        stats.samples.append(sampled(residual).astype(np.float32))
        for store in self.candidates:
            if not store.keeps:
                continue
            key = str(store)
            ops.synchronize(residual)  # on an accelerator, time the store's work, not what was queued before
            start = time.perf_counter()
            back = store.take(ops, store.put(ops, None, residual, name), name, residual)[0]
            ops.synchronize(residual if back is None else back)
            stats.seconds[key] = stats.seconds.get(key, 0.0) + time.perf_counter() - start
            lost = sampled(residual if back is None else residual - back)
            stats.lost[key] = stats.lost[key] + lost if key in stats.lost else lost

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
        self._index = {}
