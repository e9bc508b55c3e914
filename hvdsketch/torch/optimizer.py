"""``hvdsketch.torch.DistributedOptimizer``: Horovod's optimizer API with any hvdsketch compressor.

Like ``horovod.torch.DistributedOptimizer`` it wraps a ``torch.optim``
optimizer (the returned object is an instance of the same class, so LR
schedulers and checkpoints keep working) and averages gradients across ranks
before ``step()``. Unlike Horovod's drop-in path it knows each tensor's name
and the step, so hash seeds change every step; it gives each tensor its own
compressor by a policy (rules, or ``auto``: :mod:`hvdsketch.policy`); it runs compressors that need
allgathers or several rounds (top-k, PowerSGD), error feedback from a
residual memory, keeps row-sparse embedding gradients sparse end to end, and
counts the bytes it sends. All tensors' messages of one round travel in one
fused Horovod collective.

At construction every rank checks that all ranks run the same compressor,
memory and parameter shapes; a mismatch raises on every rank.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterable, Mapping

import numpy as np
import torch

from hvdsketch.collectives.horovod import HorovodCommunicator
from hvdsketch.compress import Compressor, RowSparse, TensorContext
from hvdsketch.memory import Memory
from hvdsketch.exchange import exchange_all, verify_agreement
from hvdsketch.ops import torch as torch_ops
from hvdsketch.policy import Policy


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, policy: Policy, memory: Any,
                 communicator: HorovodCommunicator) -> None:
        super(self.__class__, self).__init__(params)
        self._policy = policy
        self._memory = memory
        self._communicator = communicator
        all_params = [p for group in self.param_groups for p in group["params"]]
        names = {id(p): name for name, p in named_parameters} if named_parameters is not None else {}
        if named_parameters is not None and len(names) != len(all_params):
            raise ValueError("hvdsketch: named_parameters must name every parameter of the optimizer once")
        self._names = {p: names.get(id(p), f"param.{i}") for i, p in enumerate(all_params)}
        self._step_count = 0
        self._bytes_dense = 0
        self._should_synchronize = True
        layout = ";".join(f"{n}:{tuple(p.shape)}" for p, n in self._names.items())
        verify_agreement(communicator, f"{policy}|{memory}|{layout}", torch_ops)

    def synchronize(self) -> None:
        """Average every gradient across ranks, compressed; called by :meth:`step`."""
        params = [p for p in self._names if p.grad is not None]
        grads = [_as_hvdsketch(p.grad) for p in params]
        contexts = [TensorContext(self._names[p], tuple(p.shape), self._step_count, self._communicator.size,
                                  self._communicator.rank)
                    for p in params]
        jobs = list(zip(self._policy.select(grads, contexts, self._communicator), grads, contexts))
        for p, averaged in zip(params, exchange_all(jobs, self._communicator, self._memory)):
            p.grad = _as_torch(averaged)
            self._bytes_dense += p.numel() * p.element_size()
        self._step_count += 1

    @contextmanager
    def skip_synchronize(self):
        """As in Horovod: ``synchronize(); clip(...); with skip_synchronize(): step()``."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            self.synchronize()
        return super(self.__class__, self).step(closure)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state plus hvdsketch's: the step (it seeds the hashes), the
        policy's choices, the compressors' per-tensor state (PowerSGD's Q, DGC's velocity, their
        residuals) and the residual memory, so a resumed run continues exactly as the
        uninterrupted one."""
        state = super(self.__class__, self).state_dict()
        compressors = {flag: c.state_dict() for flag, c in self._policy.compressors().items()}
        state["hvdsketch"] = {"step": self._step_count, "policy": self._policy.state_dict(),
                              "compressors": {flag: s for flag, s in compressors.items() if s},
                              "memory": None if self._memory is None else self._memory.state_dict()}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        ours = state_dict.pop("hvdsketch", None)
        super(self.__class__, self).load_state_dict(state_dict)
        if ours is not None:
            self._step_count = ours["step"]
            self._policy.load_state_dict(ours.get("policy") or {})
            compressors = self._policy.compressors()
            devices = {name: p.device for p, name in self._names.items()}
            for flag, state in (ours.get("compressors") or {}).items():
                if flag not in compressors:
                    raise ValueError(f"hvdsketch: the checkpoint holds state of compressor {flag!r}, which "
                                     f"this run's compression {self._policy} does not use")
                compressors[flag].load_state_dict(
                    state, lambda name, array: torch.from_numpy(np.array(array)).to(devices.get(name, "cpu")))
            if self._memory is not None and ours["memory"] is not None:
                self._memory.load_state_dict(ours["memory"])

    def report(self) -> dict[str, Any]:
        """Bytes this rank sent (per collective and in total) against dense ring allreduce, and the
        policy's assignment table (``None`` for a single compressor, or before it decided)."""
        from hvdsketch.collectives.stats import ring_allreduce_bytes

        sent = self._communicator.stats.bytes_sent
        dense = ring_allreduce_bytes(self._bytes_dense, self._communicator.size)
        table = self._policy.assignment
        return {"compression": str(self._policy), "steps": self._step_count, "bytes_sent": sent,
                "assignment": None if table is None else [row.to_dict() for row in table],
                "bytes_dense_allreduce": dense, "ratio": dense / sent if sent else float("nan"),
                "seconds": dict(self._communicator.stats.seconds),
                "residual_bytes": 0 if self._memory is None else self._memory.nbytes() + self._memory.host_nbytes(),
                "collectives": self._communicator.stats.snapshot()}


def _as_hvdsketch(grad: torch.Tensor) -> Any:
    if not grad.is_sparse:
        return grad
    grad = grad.coalesce()
    return RowSparse(grad.indices()[0], grad.values(), tuple(grad.shape))


def _as_torch(averaged: Any) -> torch.Tensor:
    if isinstance(averaged, RowSparse):
        return torch.sparse_coo_tensor(averaged.indices[None, :], averaged.values, averaged.dense_shape)
    return averaged


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None = None,
                         compression: "str | Compressor | Policy | Mapping | list | None" = None,
                         memory: "str | Memory | None" = None) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that ``step()`` first averages gradients across Horovod ranks.

    Args:
        optimizer: any ``torch.optim`` optimizer.
        named_parameters: ``model.named_parameters()``; names seed the hashes and label reports.
        compression: a flag such as ``"sketch:error=0.5"`` or ``"auto:bandwidth=1gbit"``, per-tensor
            rules (a list of :class:`hvdsketch.policy.Rule` or a ``{rules:, default:}`` mapping), a
            compressor or a :class:`hvdsketch.policy.Policy`; falls back to ``HVDSKETCH_COMPRESSION``,
            then ``"none"``.
        memory: error feedback: a ``--memory`` flag (``"fp32"``, ``"plan:budget=0.25"``) or a
            :class:`hvdsketch.memory.Memory`; ``None`` for none. Its residuals are part of
            :meth:`state_dict`.
    """
    import horovod.torch as hvd

    from hvdsketch.memory import create as create_memory
    from hvdsketch.policy import create as create_policy

    memory = None if memory is None else create_memory(memory)
    policy = create_policy(compression)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    named = list(named_parameters) if named_parameters is not None else None
    return cls(optimizer.param_groups, named, policy, memory, HorovodCommunicator(hvd))
