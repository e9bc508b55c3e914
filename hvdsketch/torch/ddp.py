"""hvdsketch as a PyTorch DDP communication hook: any hvdsketch compressor, no Horovod.

One line added to a plain ``DistributedDataParallel`` script (launched with ``torchrun``)::

    import hvdsketch.torch.ddp as hvdsketch_ddp

    model = torch.nn.parallel.DistributedDataParallel(model)
    model.register_comm_hook(hvdsketch_ddp.ExchangeState(model, compression="auto"), hvdsketch_ddp.exchange_hook)

As PyTorch's ``powerSGD_hook`` with its ``PowerSGDState``: one :class:`ExchangeState` per DDP model, and
:func:`exchange_hook`, whose future holds a bucket's averaged gradients. Exchanges start as DDP hands over each
bucket, so they overlap backward; ``compression="none"`` gives DDP's own allreduce bit for bit.

What DDP users do keeps working: ``no_sync()``, ``find_unused_parameters``, ``static_graph``, any floating
dtype, sparse gradients (handed back sparse), several DDP models (each its own state, and its own process group
where their backward passes interleave), ``autocast`` and ``torch.amp.GradScaler``.

Checkpoints: :meth:`ExchangeState.state_dict` gathers every rank's state (call it on every rank); rank 0 saves
it, and every rank resumes from that file with :meth:`ExchangeState.load_state_dict`::

    hook_state = state.state_dict()                      # every rank
    if dist.get_rank() == 0:
        torch.save({"model": model.state_dict(), "hook": hook_state}, path)
    ...
    state.load_state_dict(torch.load(path)["hook"])    # every rank
"""
# No ``from __future__ import annotations``: DDP checks the hook's annotations as objects.
import contextlib
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import torch
import torch.distributed as dist

from hvdsketch.collectives.torchdist import TorchDistCommunicator
from hvdsketch.exchange.session import Session, Tensor
from hvdsketch.ops import torch as torch_ops
from hvdsketch.torch import convert, saved
from hvdsketch.torch.ddp_param import ParameterSteps

__all__ = ["ExchangeState", "exchange_hook"]


@dataclass
class _Bucket:
    """One bucket of this step, until the last bucket completes its future."""

    names: tuple[str, ...]
    buffer: torch.Tensor
    gradients: list[torch.Tensor]  # views into a dense buffer; the sparse buffer itself
    future: torch.futures.Future


class ExchangeState:
    """The state of :func:`exchange_hook` for one DDP model: its :class:`~hvdsketch.exchange.session.Session`
    and this step's buckets.

    Args:
        model: the ``DistributedDataParallel`` model (its module's parameter names are used), a
            module, or ``named_parameters`` pairs naming every parameter DDP reduces.
        compression: a flag, per-tensor rules, a compressor or a policy, as
            :func:`hvdsketch.torch.DistributedOptimizer` takes.
        memory: error feedback: a ``--memory`` flag or a :class:`hvdsketch.memory.Memory`; ``None`` for none.
        process_group: the ``torch.distributed`` group to average over (default: the default group).
        sparse_as_dense: densify sparse gradients before compressing (they come back sparse).
        prefix: the start of every collective's label (reports).
        error_if_nonfinite: ``False`` (the default): a NaN or Inf average is handed back, as DDP's is,
            for ``torch.amp.GradScaler`` to skip the step, the state kept as before it; ``True``: raise
            ``FloatingPointError`` on every rank.
        collectives: ``"torch"`` (``torch.distributed`` over ``process_group``) or ``"mpi"``
            (:mod:`hvdsketch.collectives.mpi`: every rank of an ``mpirun`` job, whose ranks must be DDP's;
            lower latency for small collectives on CPU hosts).

    Raises:
        ValueError: ``named_parameters`` naming a parameter twice, or a flag that is not valid.
        TypeError: ``sparse_as_dense`` not a bool.

    Example::

        model = torch.nn.parallel.DistributedDataParallel(model)
        state = hvdsketch.torch.ddp.ExchangeState(model, compression="sketch:error=0.5", memory="fp32")
        model.register_comm_hook(state, hvdsketch.torch.ddp.exchange_hook)
        ...
        print(state.report())   # bytes sent against a dense allreduce, per collective
    """

    def __init__(self, model: "torch.nn.Module | Iterable[tuple[str, torch.Tensor]]",
                 compression: Any = None, memory: Any = None, process_group: Any = None,
                 sparse_as_dense: bool = False, prefix: str = "hvdsketch.ddp", error_if_nonfinite: bool = False,
                 collectives: str = "torch") -> None:
        ignored: set[str] = set()
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            ignored = set(getattr(model, "parameters_to_ignore", ()))
            model = model.module
        named = convert.named(model.named_parameters() if isinstance(model, torch.nn.Module) else model)
        if len({name for name, _ in named}) != len(named):
            raise ValueError("hvdsketch: named_parameters must name each parameter once, with unique names")
        if not isinstance(sparse_as_dense, bool):
            raise TypeError(f"hvdsketch: sparse_as_dense must be True or False, got {sparse_as_dense!r}")
        self._names = {p: name for name, p in named}
        self._place = {name: i for i, (name, _) in enumerate(named)}  # each parameter's place in the model
        #: What DDP reduces every step: every bucket's parameter names (until a step shows them).
        self._reduced = {name for name, p in named if p.requires_grad and name not in ignored}
        self.communicator = _communicator(collectives, process_group)
        self.session = Session(compression, memory, self.communicator, torch_ops, sparse_as_dense=sparse_as_dense,
                               prefix=prefix, error_if_nonfinite=error_if_nonfinite)
        self._buckets: list[_Bucket] = []  # this step's, until its last bucket
        self._given: set[str] = set()  # the names of this step's buckets so far
        self._layout: list[tuple[str, ...]] = []  # the last step's buckets, by names
        self._joined: list[bool] = []  # by the layout's buckets: whether it waits for the next (see _joins)
        self._ready: list[tuple[tuple[str, ...], Mapping[str, torch.Tensor]]] = []  # buckets waiting to start
        self._resumed: list[tuple[str, ...]] = []  # the buckets of the step a checkpoint was saved after
        self._streaming = False  # this step's buckets start as they come
        self._bytes_dense = 0
        self._parameter_steps = ParameterSteps(self)  # DDP's per-parameter form (compiled autograd)

    # -- one bucket, one step ---------------------------------------------------------------------

    def reduce(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """The future of ``bucket``'s averaged gradients (what :func:`exchange_hook` returns)."""
        buffer = bucket.buffer()
        names = tuple(self._name(p) for p in bucket.parameters())
        gradients = [buffer] if buffer.is_sparse else list(bucket.gradients())
        devices = [buffer.device] if buffer.device.type == "cuda" else None
        current = _Bucket(names, buffer, gradients, torch.futures.Future(devices=devices))
        self._buckets.append(current)
        self._given.update(names)
        try:
            if len(self._buckets) == 1:
                self._streaming = bool(self._layout) and self._layout[0] == names
                if self._streaming:
                    self._begin(self._layout)
            if self._streaming:
                self._ready.append((names, dict(zip(names, gradients))))
                k = len(self._buckets) - 1
                if not (k < len(self._joined) and self._joined[k]):
                    self._start()
            if bucket.is_last() or self._reduced <= self._given:
                self._end_step()
        except BaseException as error:
            self._abandon(error)
            raise
        return current.future

    def _name(self, p: torch.Tensor) -> str:
        name = self._names.get(p)
        if name is None:
            raise ValueError(f"hvdsketch: DDP reduces a parameter of shape {tuple(p.shape)} that the hook's "
                             f"ExchangeState was not given; make it from the DDP model or its named_parameters()")
        return name

    def _begin(self, layout: list[tuple[str, ...]]) -> None:
        """A step's first start: the ranks' agreement where a world begins, the launch order."""
        self.session.begin(self._described)
        self.session.expect([name for names in layout for name in names])

    def _start(self) -> None:
        """Start the ready buckets' exchanges, their first rounds together; dense averages land in the buffer."""
        ready, self._ready = self._ready, []
        # one collective per (op, dtype) for them all, where the communicator fuses
        fusing = getattr(self.communicator, "fusing", contextlib.nullcontext)
        with fusing():
            for names, gradients in ready:
                for name in names:
                    gradient = gradients[name]
                    self.session.start(name, convert.as_hvdsketch(gradient), out=None if gradient.is_sparse else gradient)

    def _joins(self, layout: list[tuple[str, ...]]) -> list[bool]:
        """For each bucket of ``layout``, whether DDP calls the next bucket's hook at once after its own
        (backward reaches parameters last to first), so it waits for it. From the layout alone: alike on every rank."""
        first = [min(self._place[name] for name in names) for names in layout]
        return [first[k + 1] >= min(first[:k + 1]) for k in range(len(layout) - 1)] + [False]

    def _end_step(self) -> None:
        """The last bucket: start what waited, finish every exchange, complete every future. The first step
        after a resume starts in the saved step's bucket order (DDP rebuilds its layout), so sums are bit for bit."""
        buckets, self._buckets = self._buckets, []
        self._given.clear()
        layout = [bucket.names for bucket in buckets]
        resumed, self._resumed = self._resumed, []
        if self._streaming:
            self._start()
        else:
            same = sorted(n for names in resumed for n in names) == sorted(n for names in layout for n in names)
            order = resumed if same else layout
            self._begin(order)
            gradients = {name: g for bucket in buckets for name, g in zip(bucket.names, bucket.gradients)}
            for names in order:
                self._ready.append((names, gradients))
                self._start()
        averaged = self.session.finish()
        self._layout, self._joined = layout, self._joins(layout)
        self._reduced = {name for names in layout for name in names}
        for bucket in buckets:
            if bucket.buffer.is_sparse:
                result = convert.as_torch(averaged[bucket.names[0]])
                sparse_dim = bucket.buffer.sparse_dim()
                if not (result.is_sparse and result.sparse_dim() == sparse_dim):
                    result = convert.sparse_layout(result.to_dense() if result.is_sparse else result, sparse_dim)
                bucket.future.set_result(result)
            else:
                for name, gradient in zip(bucket.names, bucket.gradients):
                    result = convert.as_torch(averaged[name])
                    torch_ops.into(gradient, result.to_dense() if result.is_sparse else result)
                bucket.future.set_result(bucket.buffer)
            self._bytes_dense += sum(torch_ops.nbytes(g) if not g.is_sparse else
                                     g.shape.numel() * g.element_size() for g in bucket.gradients)

    def _abandon(self, error: BaseException) -> None:
        """A step broken off: every bucket's future fails with ``error``, no exchange goes on."""
        buckets, self._buckets = self._buckets, []
        self._given.clear()
        self._ready.clear()
        for bucket in buckets:
            if not bucket.future.done():
                bucket.future.set_exception(error)
        self.session.abandon()

    def _described(self) -> list[Tensor]:
        return [Tensor(name, tuple(p.shape), torch_ops.dtype_name(p),
                                 "" if p.requires_grad else "requires_grad=False")
                for p, name in self._names.items()]

    # -- checkpoints and reports ------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Every rank's hvdsketch state under ``"hvdsketch"`` (collective: call it on every rank between steps;
        rank 0 saves it). See :mod:`hvdsketch.exchange.checkpoint`."""
        if self._buckets:
            raise RuntimeError("hvdsketch: a step is under way (DDP has called the hook for some buckets); "
                               "call state_dict() after backward")
        return {"hvdsketch": saved.to_torch(self.session.gather()),
                "buckets": [list(names) for names in self._layout]}

    def load_state_dict(self, state: Mapping[str, Any], reset_on_change: bool = False) -> None:
        """Resume this rank from its entry of :meth:`state_dict`'s checkpoint (loaded on every rank). Another
        number of ranks or compression setup raises ``ValueError``; ``reset_on_change=True`` starts afresh, warned."""
        if self._buckets:
            raise RuntimeError("hvdsketch: cannot load state while a step is under way")
        if "hvdsketch" not in state:
            raise ValueError("hvdsketch: the hook state has no 'hvdsketch' entry (one made by "
                             "ExchangeState.state_dict(), called on every rank)")
        states = self.session.resolve(saved.to_numpy(state["hvdsketch"]), reset_on_change)
        self._resumed = [tuple(names) for names in state.get("buckets", [])]
        self.session.load(states, saved.converter({name: p.device for p, name in self._names.items()}))

    def report(self) -> dict[str, Any]:
        """Bytes sent against a dense allreduce (:meth:`hvdsketch.exchange.session.Session.report`)."""
        return self.session.report(self._bytes_dense)


def _communicator(collectives: str, process_group: Any) -> Any:
    """The communicator ``collectives`` names (see :class:`ExchangeState`)."""
    if collectives == "torch":
        return TorchDistCommunicator(process_group)
    if collectives != "mpi":
        raise ValueError(f"hvdsketch: collectives must be 'torch' or 'mpi', got {collectives!r}")
    if process_group is not None:
        raise ValueError("hvdsketch: collectives='mpi' averages over every MPI rank; it takes no process_group")
    from mpi4py import MPI

    from hvdsketch.collectives.mpi import MPICommunicator

    communicator = MPICommunicator()
    differs = (communicator.rank, communicator.size) != (dist.get_rank(), dist.get_world_size())
    if communicator.comm.allreduce(differs, op=MPI.LOR):  # on every rank alike
        raise ValueError(f"hvdsketch: collectives='mpi' needs MPI's ranks to be DDP's, and on some rank they differ "
                         f"(here MPI rank {communicator.rank} of {communicator.size}, torch.distributed rank "
                         f"{dist.get_rank()} of {dist.get_world_size()}); launch with mpirun, ranks in one order")
    return communicator


@torch.compiler.disable  # run eagerly where dynamo would trace it (compiled autograd)
def exchange_hook(state: ExchangeState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: ``bucket``'s gradients averaged by hvdsketch, as a future.

    Args:
        state: the DDP model's :class:`ExchangeState`.
        bucket: DDP's ``GradBucket``; or, in compiled autograd's per-parameter form, ``(param.grad, param)``,
            whose ``param.grad`` is averaged in place at the step's last gradient (:mod:`hvdsketch.torch.ddp_param`).

    Returns:
        A ``torch.futures.Future`` of the bucket's averaged gradients.
    """
    if isinstance(bucket, tuple):
        return state._parameter_steps.add(*bucket)
    return state.reduce(bucket)
