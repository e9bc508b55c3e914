"""hvdsketch's reduction of one FSDP2 model's gradients: its sessions and each step's way through them.

A step is one backward: its first reduce-scatter begins it and queues a callback for the end of backward,
which ends it. Each module's reduce-scatter is one exchange, completed in FSDP's call (FSDP reads its block
when the call returns); with HSDP a second session averages each block across the replicas.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Mapping

import numpy as np
import torch
import torch.distributed as dist

from hvdsketch import spec as _spec
from hvdsketch.collectives.stats import reduce_scatter_bytes
from hvdsketch.collectives.torchdist import TorchDistCommunicator
from hvdsketch.exchange.session import Session, StateReset, Tensor, afresh, verify
from hvdsketch.ops import torch as torch_ops
from hvdsketch.torch.fsdp import checkpoint as fsdp_checkpoint
from hvdsketch.torch.fsdp import modules
from hvdsketch.torch.fsdp.hooks import CompressedReduceScatter, ReplicaAllReduce
from hvdsketch.torch.fsdp.modules import Shard

#: How to set up HSDP so hvdsketch carries the replica all-reduce.
HSDP = ("give fully_shard the shard dimension's 1-D mesh (mesh['shard']) and hvdsketch the replicas "
        "(compress(..., replicate=mesh['replicate']))")


class FSDPReduction:
    """The reduction of ``model``'s gradients (every ``FSDPModule`` in it) through hvdsketch; what
    :func:`hvdsketch.torch.fsdp.compress` returns (see :mod:`hvdsketch.torch.fsdp`).

    Attributes:
        session: the reduce-scatter's :class:`~hvdsketch.exchange.session.Session`, over FSDP's shard group.
        replica: the replica all-reduce's (HSDP), or ``None``.
        shards: each FSDP module's reduce-scatter, by module name.
    """

    def __init__(self, model: torch.nn.Module, compression: Any = None, memory: Any = None, *,
                 replicate: Any = None, replicate_compression: Any = None, replicate_memory: Any = None,
                 error_if_nonfinite: bool = False, prefix: str = "hvdsketch.fsdp") -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"hvdsketch: compress takes the model fully_shard wrapped, got {type(model).__name__}")
        if not dist.is_initialized():
            raise RuntimeError("hvdsketch: torch.distributed is not initialized; call "
                               "torch.distributed.init_process_group first (torchrun sets the environment)")
        missing = modules.missing_api(replicate is not None)
        found, problem = [], None
        if missing is None:
            try:
                found = modules.shards(model)
            except ValueError as error:  # several parameter groups: raised on every rank, after the check
                problem = error
        groups = {id(s.group): s.group for s in found}
        self.communicator = TorchDistCommunicator(next(iter(groups.values()), None))
        replicas = _replica_group(replicate)
        # before anything that may raise on some ranks only: every rank checks the others' setup
        verify(self.communicator, {
            "pytorch": torch.__version__, "fsdp2": missing or str(problem or "ok"),
            "compression": _flag(compression), "memory": str(memory),
            "replicate": "none" if replicas is None else f"{dist.get_world_size(replicas)} replicas",
            "replicate_compression": _flag(replicate_compression), "replicate_memory": str(replicate_memory),
            **{f"fsdp module {s.name!r}": f"{s.dtype} {s.shape} over {s.mesh}" for s in found}}, torch_ops,
            advice="start every rank with the same PyTorch, model (its fully_shard modules) and hvdsketch arguments")
        if missing:
            raise RuntimeError(f"hvdsketch: {missing}")
        if problem is not None:
            raise problem
        if not found:
            raise ValueError("hvdsketch: the model has no FSDP module with parameters; call fully_shard on its "
                             "blocks and on the model first, then hvdsketch.torch.fsdp.compress(model)")
        if len(groups) > 1:
            raise ValueError("hvdsketch: the model's FSDP modules reduce-scatter over different process groups; "
                             "fully_shard every module over one mesh")
        for shard in found:
            if shard.mesh == "HSDP":
                raise ValueError(f"hvdsketch: FSDP module {shard.name!r} is sharded over a 2-D mesh (native HSDP), "
                                 f"whose all-reduce FSDP runs itself; {HSDP}")
        self.shards = {s.name: s for s in found}
        self.session = Session(compression, memory, self.communicator, torch_ops, scatter=True, prefix=prefix,
                               error_if_nonfinite=error_if_nonfinite)
        self.replica: Session | None = None
        if replicas is not None:
            self.replica = Session(replicate_compression, replicate_memory, TorchDistCommunicator(replicas),
                                   torch_ops, prefix=f"{prefix}.replica", error_if_nonfinite=error_if_nonfinite)
        self._open = False  # a step (a backward) is under way
        self._replicated = False  # this step's replica exchanges have begun
        self._deferred = False  # this step ends at the end of backward, not with its call
        self._bytes_dense = 0
        for shard in found:
            shard.module.set_custom_reduce_scatter(CompressedReduceScatter(self.reduce_scatter, shard))
            shard.module.set_gradient_divide_factor(1.0)  # hvdsketch averages: FSDP must not scale too
            shard.module.set_force_sum_reduction_for_comms(True)
            if self.replica is not None:
                shard.module.set_all_reduce_hook(ReplicaAllReduce(self.all_reduce, shard))

    # -- the calls FSDP makes ---------------------------------------------------------------------

    def reduce_scatter(self, shard: Shard, output: torch.Tensor, input: torch.Tensor, group: Any, op: Any) -> None:
        """``output`` = this rank's block of the average of ``input`` over the shard group."""
        self._check_call(shard, input, group, op)
        self._begin()
        try:
            self._run(self.session, shard.name, input.view(shard.shape), output.view(shard.block))
        except BaseException:
            self._abandon()
            raise
        self._bytes_dense += input.numel() * input.element_size()
        if not self._deferred:
            self._end_step()

    def all_reduce(self, shard: Shard, block: torch.Tensor) -> None:
        """``block`` averaged across the replicas, in place (HSDP)."""
        if not self._replicated:
            self.replica.begin(lambda: self._described(self.replica))
            self._replicated = True
        try:
            self._run(self.replica, shard.name, block.view(shard.block), block.view(shard.block))
        except BaseException:
            self._abandon()
            raise

    @staticmethod
    def _run(session: Session, name: str, tensor: torch.Tensor, out: torch.Tensor) -> None:
        """Exchange ``tensor`` as ``name``, its result written into ``out`` (FSDP's memory)."""
        session.start(name, tensor, out=out)
        result = session.complete(name)
        if not torch_ops.same_memory(result, out):
            out.copy_(result)

    def _check_call(self, shard: Shard, input: torch.Tensor, group: Any, op: Any) -> None:
        """FSDP calls as :meth:`__init__` set it up: this module's layout, over the shard group, unscaled."""
        if input.numel() != shard.numel:
            raise ValueError(f"hvdsketch: FSDP reduce-scatters {input.numel()} elements for module {shard.name!r}, "
                             f"whose parameters' shards take {shard.numel}: parameters without a gradient this step "
                             f"leave FSDP's layout (module.set_reduce_scatter_unused_params(True) keeps it)")
        if group is not self.communicator.group and self.communicator.group is not None:
            raise ValueError(f"hvdsketch: FSDP reduce-scatters module {shard.name!r} over another process group than "
                             f"compress() found; call compress() after fully_shard and set_*_process_group")
        state = shard.module._get_fsdp_state()._fsdp_param_groups[0]
        if op != dist.ReduceOp.SUM or state.gradient_divide_factor != 1.0:
            raise ValueError(f"hvdsketch: FSDP would scale module {shard.name!r}'s gradients as well as hvdsketch "
                             f"(set_gradient_divide_factor / set_force_sum_reduction_for_comms were changed after "
                             f"compress()); hvdsketch averages them itself")

    # -- steps ------------------------------------------------------------------------------------

    def _begin(self) -> None:
        """A step's first reduce-scatter: the ranks agree, and the step's end is queued for the end of backward."""
        if self._open:
            return
        self.session.begin(lambda: self._described(self.session))
        self._open = True
        try:
            torch.autograd.Variable._execution_engine.queue_callback(self._end_step)
            self._deferred = True
        except RuntimeError:  # not inside backward: this call is the whole step
            self._deferred = False

    def _end_step(self) -> None:
        """End of backward: every session ends its step (checks, casts, the policy's decisions)."""
        if not self._open:
            return
        self._open = False
        replicated, self._replicated = self._replicated, False
        try:
            self.session.finish()
            if replicated:
                self.replica.finish()
        except BaseException:
            self._abandon()
            raise

    def _abandon(self) -> None:
        self._open = self._replicated = False
        for session in (self.session, self.replica):
            if session is not None:
                session.abandon()

    def _described(self, session: Session) -> list[Tensor]:
        replica = session is self.replica
        return [Tensor(s.name, s.block if replica else s.shape, s.dtype)
                for s in self.shards.values()]

    # -- checkpoints ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This rank's state, between steps (:mod:`hvdsketch.torch.fsdp.checkpoint`), for
        ``torch.distributed.checkpoint`` (it is ``Stateful``) or a file per rank. No collective."""
        if self._open:
            raise RuntimeError("hvdsketch: a step is under way (FSDP has reduce-scattered some modules); "
                               "call state_dict() after backward")
        states = {"reduce_scatter": self.session.state_dict(),
                  "replica": None if self.replica is None else self.replica.state_dict()}
        return {"world": self.communicator.size, "setup": self._setup(),
                fsdp_checkpoint.key(self.communicator.rank): fsdp_checkpoint.pack(states)}

    def load_state_dict(self, state: Mapping[str, Any], reset_on_change: bool = False) -> None:
        """Resume this rank bit for bit from its entry of :meth:`state_dict` (loaded on every rank). Another
        number of ranks or setup raises ``ValueError``; ``reset_on_change=True`` starts afresh, warned."""
        if self._open:
            raise RuntimeError("hvdsketch: cannot load state while a step is under way")
        rank, size = self.communicator.rank, self.communicator.size
        entry = fsdp_checkpoint.key(rank)
        if not isinstance(state, Mapping) or "world" not in state or "setup" not in state:
            raise ValueError("hvdsketch: not a state of hvdsketch's FSDP front end (one made by "
                             "FSDPReduction.state_dict())")
        changed = " and ".join(([f"{state['world']} ranks (this run has {size})"] if state["world"] != size else [])
                               + ([f"setup {state['setup']!r} (this run: {self._setup()!r})"]
                                  if state["setup"] != self._setup() else []))
        if changed and not reset_on_change:
            raise ValueError(f"hvdsketch: the checkpoint was made with {changed}; its per-rank state cannot resume "
                             f"this run exactly: resume with the same ranks and setup, or pass reset_on_change=True")
        if entry not in state:
            raise ValueError(f"hvdsketch: the checkpoint holds no state of rank {rank} (load it on every rank, each "
                             f"its own entry, as torch.distributed.checkpoint does)")
        states = fsdp_checkpoint.unpack(state[entry])
        for session, saved in ((self.session, states["reduce_scatter"]), (self.replica, states["replica"])):
            if session is None:
                continue
            if changed:
                saved = {**afresh(saved, keep_setup=state["setup"] == self._setup()), "world": size}
                if rank == 0:
                    warnings.warn(StateReset(f"hvdsketch: the checkpoint was made with {changed}: the "
                                             f"residuals and compressors' state start afresh"), stacklevel=2)
            session.load_state_dict(saved, self._tensor)

    def _tensor(self, name: str, array: np.ndarray) -> torch.Tensor:
        """A checkpoint's array of tensor ``name``, on the device of that module's gradients."""
        shard = self.shards.get(name)
        device = next(shard.module.parameters()).device if shard is not None else torch.device("cpu")
        return torch.from_numpy(np.array(array)).to(device)

    def _setup(self) -> str:
        replica = "" if self.replica is None else f"; replica {self.replica.policy} memory {self.replica.memory}"
        return f"compression {self.session.policy} memory {self.session.memory}{replica}"

    # -- reports ----------------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """Bytes sent against FSDP's own reduce-scatter (``bytes_dense_reduce_scatter``), the policy's choice
        per module; with HSDP, the replica all-reduce's under ``"replica"``."""
        report = self.session.report(self._bytes_dense)
        dense = reduce_scatter_bytes(self._bytes_dense, self.communicator.size)
        del report["bytes_dense_allreduce"]
        report.update(bytes_dense_reduce_scatter=dense,
                      ratio=dense / report["bytes_sent"] if report["bytes_sent"] else math.nan)
        if self.replica is not None:
            blocks = self._bytes_dense // self.communicator.size
            report["replica"] = self.replica.report(blocks)
        return report


def _flag(compression: Any) -> str:
    """A compression argument as the ranks compare it (``None``: what the environment gives)."""
    return str(_spec.resolve(compression) if compression is None else compression)


def _replica_group(replicate: Any) -> Any:
    """The process group of ``replicate`` (a process group, or a 1-D ``DeviceMesh``), or ``None``."""
    if replicate is None or isinstance(replicate, dist.ProcessGroup):
        return replicate
    if hasattr(replicate, "get_group") and getattr(replicate, "ndim", 1) == 1:
        return replicate.get_group()
    raise TypeError(f"hvdsketch: replicate takes the replicas' process group or 1-D DeviceMesh, "
                    f"got {type(replicate).__name__}")
