"""``hvdsketch.torch.DistributedOptimizer``: Horovod's optimizer with any hvdsketch compressor.

Like ``horovod.torch.DistributedOptimizer`` it wraps a ``torch.optim`` optimizer (returning an instance of its
class), takes Horovod's arguments with their meaning, and starts each gradient's exchange from its gradient hook,
overlapping backward. Unlike it, it knows tensor names and steps, picks each tensor's compressor by a policy
(:mod:`hvdsketch.policy`), runs multi-round compressors and error feedback, keeps sparse gradients sparse and
counts bytes. A parameter without a gradient on some rank takes part with zeros, as in Horovod. Its
``state_dict()`` carries every rank's state; Horovod elastic: :mod:`hvdsketch.torch.elastic`.
"""
from __future__ import annotations

import abc
import copy
import math
import warnings
from contextlib import contextmanager
from typing import Any, Iterable, Mapping

import torch

from hvdsketch.collectives.horovod import HorovodCommunicator
from hvdsketch.compress import Compressor
from hvdsketch.exchange.session import Memory, Policy, Session, Tensor, create_policy
from hvdsketch.ops import torch as torch_ops
from hvdsketch.torch import convert, saved


class Distributed(abc.ABC):
    """What every optimizer :func:`DistributedOptimizer` makes is an instance of (its class is made per wrapped
    optimizer class, as Horovod's)."""


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, names: dict[torch.Tensor, str], session: Session,
                 backward_passes_per_step: int, groups: list[tuple[torch.Tensor, ...]] | None) -> None:
        super(self.__class__, self).__init__(params)
        self._names = names
        self._session = session
        self.backward_passes_per_step = backward_passes_per_step
        self._delay = {p: backward_passes_per_step for p in names}
        self._group_of = {p: group for group in groups or [] for p in group}
        self._ready: dict[tuple[torch.Tensor, ...], int] = {}
        self._started: set[torch.Tensor] = set()
        self._sparse: dict[torch.Tensor, int] = {}  # parameters whose gradients come sparse: their sparse dims
        self._bytes_dense = 0
        self._synchronized = False
        self._backward = False  # a gradient hook fired since the last exchange
        self._should_synchronize = True
        self._requires_update = [p for p in names if p.requires_grad]
        self._loaded: list[dict[str, Any]] | None = None  # every rank's state from the last load, until a step
        self._torch_only = False
        process_set = getattr(session.communicator, "process_set", None)
        self._included = process_set is None or process_set.included()
        if self._included:  # as in Horovod, ranks outside the process set neither hook nor exchange
            session.expect([names[p] for p in reversed(self._requires_update)])  # backward: last layer first
            self._hooks = [p.register_post_accumulate_grad_hook(self._make_hook(p)) for p in self._requires_update]

    # -- Horovod's hook / synchronize pattern ------------------------------------------------------

    def _make_hook(self, p: torch.Tensor):
        def hook(*_: Any) -> None:
            self._backward = True
            if self._delay[p] <= 0:
                raise AssertionError("Gradients were computed more than backward_passes_per_step times before "
                                     "call to step(). Increase backward_passes_per_step to accumulate gradients "
                                     "locally.")
            self._delay[p] -= 1
            if self._delay[p] > 0:
                return
            group = self._group_of.get(p)
            if group is None:
                self._start(p)
                return
            self._ready[group] = self._ready.get(group, 0) + 1
            if self._ready[group] == len(group):  # a group's exchanges start together
                for q in group:
                    self._start(q)
        return hook

    def _start(self, p: torch.Tensor) -> None:
        grad = p.grad
        if grad is None:  # no gradient on this rank this step: take part with zeros, as Horovod does
            grad = (torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.int64, device=p.device),
                                            p.new_zeros((0, *p.shape[1:])), tuple(p.shape), device=p.device,
                                            check_invariants=False)
                    if p in self._sparse else torch.zeros_like(p))
        elif grad.is_sparse:
            self._sparse[p] = grad.sparse_dim()
        if not self._started:
            self._join()
        self._started.add(p)
        dense = not grad.is_sparse and grad is p.grad and grad.is_contiguous()
        self._session.start(self._names[p], convert.as_hvdsketch(grad), out=grad if dense else None)

    def _join(self, elastic: bool = False) -> None:
        """Where a world begins (first step, elastic resize or sync: ``elastic=True``), check every rank agrees."""
        self._session.begin(self._described, rejoin=elastic)

    def _described(self) -> list[Tensor]:
        """The parameters as the ranks compare them where a world begins, with which this rank exchanges."""
        exchanged = set(self._requires_update)
        return [Tensor(n, tuple(p.shape), torch_ops.dtype_name(p),
                                 "" if p in exchanged else "requires_grad=False when the optimizer was made")
                for p, n in self._names.items()]

    def synchronize(self) -> None:
        """Wait for every gradient's exchange and put the averages in ``.grad``; called by :meth:`step`.
        Parameters whose hooks did not fire are exchanged now."""
        if not self._included:
            self._synchronized = True
            return
        for p in self._requires_update:
            if p not in self._started:
                self._start(p)
        if not self._started:
            self._join()
        averaged = self._session.finish()
        self._loaded = None
        for p in self._requires_update:
            result = convert.as_torch(averaged[self._names[p]])
            if p in self._sparse:  # the layout autograd gives, whatever the compressor sent
                same = result.is_sparse and result.sparse_dim() == self._sparse[p]
                p.grad = result if same else convert.sparse_layout(result.to_dense(), self._sparse[p])
            elif p.grad is None:
                p.grad = result.to_dense() if result.is_sparse else result
            else:  # into its own memory, as Horovod averages it (nothing where the exchange wrote it there)
                p.grad.copy_(result.to_dense() if result.is_sparse else result)
            self._bytes_dense += p.numel() * p.element_size()
            self._delay[p] = self.backward_passes_per_step
        self._started.clear()
        self._ready.clear()
        self._synchronized = True
        self._backward = False

    @contextmanager
    def skip_synchronize(self):
        """As in Horovod: ``synchronize(); clip(...); with skip_synchronize(): step()``."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._torch_only:  # Horovod's broadcast_optimizer_state making the wrapped optimizer's state
            return super(self.__class__, self).step(closure)
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(): the averaged gradients are not exchanged again. Use "
                              "`with optimizer.skip_synchronize(): optimizer.step()` after synchronize().")
            elif not self._backward and self._session.step > 0:
                warnings.warn("hvdsketch: optimizer.step() called again without a backward pass since the last "
                              "step: the gradients are already averaged, so they are not exchanged again (an "
                              "exchange would compress the average once more) and the wrapped optimizer steps "
                              "with them as they are")
            else:
                self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._session.in_flight:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(): gradients are still being "
                                 "exchanged. Call step() (or synchronize()) first.")
        return super(self.__class__, self).zero_grad(set_to_none)

    def set_backward_passes_per_step(self, passes: int) -> None:
        if passes < 1:
            raise ValueError("backward_passes_per_step must be > 0")
        self.backward_passes_per_step = passes
        self._delay = {p: passes for p in self._delay}

    # -- checkpoints and reports ------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state plus every rank's hvdsketch state under ``"hvdsketch"``
        (:mod:`hvdsketch.exchange.checkpoint`). Collective: call it on every rank between steps; rank 0 saves::

            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            if hvd.rank() == 0:
                torch.save(state, path)

        Called on rank 0 alone (Horovod's habit) it gives up waiting after ``HVDSKETCH_CHECKIN_SECONDS``
        (default 10) and warns; that checkpoint starts residuals and compressors' state afresh on every rank.
        """
        state = super(self.__class__, self).state_dict()
        if not self._torch_only:
            state["hvdsketch"] = (saved.to_torch(self._session.gather())
                                  if self._included else None)
        return state

    def load_state_dict(self, state_dict: dict[str, Any], reset_on_change: bool = False) -> None:
        """Resume from :meth:`state_dict`'s checkpoint, loaded on every rank, or on rank 0 and then
        :func:`hvdsketch.torch.broadcast_optimizer_state`. Another number of ranks or compression or memory
        setup raises ``ValueError``; ``reset_on_change=True`` instead starts residuals and compressors' state
        afresh (the step kept), warning on rank 0 (:class:`hvdsketch.exchange.checkpoint.StateReset`)."""
        state_dict = dict(state_dict)
        ours = saved.to_numpy(state_dict.pop("hvdsketch", None))
        if ours is not None and self._included:
            states = self._session.resolve(ours, reset_on_change)
        super(self.__class__, self).load_state_dict(state_dict)
        self._delay = {p: self.backward_passes_per_step for p in self._delay}
        self._synchronized = False
        if ours is not None and self._included:
            self._session.load(states, self._converter())
            self._loaded = states

    def _converter(self) -> Any:
        """What makes a checkpoint's array a tensor on the device of the parameter it belongs to."""
        return saved.converter({n: p.device for p, n in self._names.items()})

    # -- broadcast from a root and Horovod elastic (hvdsketch.torch.functions, .elastic) -----------

    @contextmanager
    def _torch_state_only(self):
        """``state_dict()`` and ``step()`` of the wrapped optimizer only (Horovod's ``broadcast_optimizer_state``)."""
        self._torch_only = True
        try:
            yield
        finally:
            self._torch_only = False

    def _distribute(self, root_rank: int) -> None:
        """Every rank takes its own state from the checkpoint the root loaded (collective)."""
        if self._included:
            state = self._session.broadcast(self._loaded, root_rank)
            if state is not None:
                self._session.load_state_dict(state, self._converter())

    def _abandon(self) -> None:
        """Forget a step broken off by a failure: its exchanges never finish."""
        self._session.abandon()
        self._started.clear()
        self._ready.clear()
        self._delay = {p: self.backward_passes_per_step for p in self._delay}
        self._synchronized = False

    def _local_state(self) -> dict[str, Any]:
        """A copy of this rank's state alone (no communication): what elastic commits."""
        return copy.deepcopy({"torch": super(self.__class__, self).state_dict(),
                              "hvdsketch": self._session.state_dict()})

    def _load_local_state(self, state: dict[str, Any]) -> None:
        self._abandon()
        state = copy.deepcopy(state)
        super(self.__class__, self).load_state_dict(state["torch"])
        self._session.load_state_dict(state["hvdsketch"], self._converter())

    def report(self) -> dict[str, Any]:
        """Bytes sent against a dense allreduce (:meth:`hvdsketch.exchange.session.Session.report`)."""
        return self._session.report(self._bytes_dense)


def _groups(groups: Any, params: list[torch.Tensor], names: dict[torch.Tensor, str]) -> list[tuple] | None:
    """Horovod's ``groups``: ``None``; a number of groups to split the parameters into (in the order
    of their names, equal on every rank); or lists of parameters, the rest each a group of one."""
    if groups is None or groups == 0:
        return None
    if isinstance(groups, int) and not isinstance(groups, bool) and groups > 0:
        from horovod.common.util import split_list

        return [tuple(part) for part in split_list(sorted(params, key=lambda p: names[p]), groups) if part]
    if isinstance(groups, list) and all(isinstance(g, (list, tuple)) for g in groups):
        seen: set[int] = set()
        out = []
        for group in groups:
            if not all(isinstance(p, torch.Tensor) for p in group):
                raise ValueError("groups must consist of torch.Tensor.")
            if any(id(p) in seen for p in group):
                raise ValueError("A parameter can only appear once in groups.")
            seen.update(id(p) for p in group)
            out.append(tuple(p for p in group if p.requires_grad))
        return [g for g in out if g]
    raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor.")


def _check_arguments(optimizer: Any, backward_passes_per_step: Any, gradient_predivide_factor: Any,
                     sparse_as_dense: Any) -> None:
    """Raise a clear error for arguments of the wrong type or out of range, before any is used."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"hvdsketch: DistributedOptimizer wraps a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    if callable(getattr(optimizer, "synchronize", None)) and callable(getattr(optimizer, "skip_synchronize", None)):
        whose = "hvdsketch.torch.DistributedOptimizer" if isinstance(optimizer, Distributed) else "hvd.DistributedOptimizer"
        raise TypeError(f"hvdsketch: DistributedOptimizer got an optimizer that {whose} already wrapped (it has "
                        f"synchronize()), whose gradients would be averaged twice; wrap the torch.optim optimizer "
                        f"once, with hvdsketch.torch.DistributedOptimizer alone (it takes Horovod's arguments): "
                        f"hvdsketch.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=...), "
                        f"named_parameters=model.named_parameters(), compression=...)")
    if not isinstance(backward_passes_per_step, int) or isinstance(backward_passes_per_step, bool):
        raise TypeError(f"hvdsketch: backward_passes_per_step must be an int, got {backward_passes_per_step!r}")
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be > 0")
    if (not isinstance(gradient_predivide_factor, (int, float)) or isinstance(gradient_predivide_factor, bool)
            or not math.isfinite(gradient_predivide_factor) or gradient_predivide_factor <= 0):
        raise ValueError(f"hvdsketch: gradient_predivide_factor must be a finite number > 0, got "
                         f"{gradient_predivide_factor!r}")
    if not isinstance(sparse_as_dense, bool):
        raise TypeError(f"hvdsketch: sparse_as_dense must be True or False, got {sparse_as_dense!r}")


def _communicator(collectives: str, hvd: Any, process_set: Any, predivide: float) -> Any:
    """The communicator ``collectives`` names: Horovod's, or hvdsketch's MPI layer."""
    if collectives == "horovod":
        return HorovodCommunicator(hvd, process_set, predivide=predivide)
    if collectives != "mpi":
        raise ValueError(f"hvdsketch: collectives must be 'horovod' or 'mpi', got {collectives!r}")
    if process_set is not None or predivide != 1.0:
        raise ValueError("hvdsketch: collectives='mpi' averages over every rank; it takes no process_set "
                         "or gradient_predivide_factor")
    from hvdsketch.collectives.mpi import MPICommunicator

    return MPICommunicator()


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None = None,
                         compression: "str | Compressor | Policy | Mapping | list | None" = None,
                         backward_passes_per_step: int = 1,
                         op: Any = None,
                         gradient_predivide_factor: float = 1.0,
                         num_groups: int = 0,
                         groups: Any = None,
                         sparse_as_dense: bool = False,
                         process_set: Any = None,
                         memory: "str | Memory | None" = None,
                         collectives: str = "horovod",
                         error_if_nonfinite: bool = False) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that ``step()`` first averages gradients across Horovod ranks.

    Args:
        optimizer: any ``torch.optim`` optimizer.
        named_parameters: ``model.named_parameters()``; names seed the hashes, name collectives, label reports.
        compression: a flag such as ``"sketch:error=0.5"`` or ``"auto:bandwidth=1gbit"``, per-tensor
            rules (a list of :class:`hvdsketch.policy.Rule` or a ``{rules:, default:}`` mapping), a
            compressor or a :class:`hvdsketch.policy.Policy`; falls back to ``HVDSKETCH_COMPRESSION``,
            then ``"none"``.
        backward_passes_per_step: backward passes accumulated locally before each exchange.
        op: ``hvd.Average`` (default) or ``hvd.Sum``; ``hvd.Adasum`` only with ``compression="none"``
            (Horovod's own Adasum optimizer).
        gradient_predivide_factor: with ``op=Average``, gradients are scaled by ``1 / factor`` before
            the sum and ``factor / size`` after it (as Horovod does).
        num_groups / groups: Horovod's explicit groups: the exchanges of a group start together once
            every gradient of the group is ready.
        sparse_as_dense: densify sparse gradients before compressing; the averaged gradient is made
            sparse again, so the optimizer sees the layout autograd gave.
        process_set: a Horovod process set to average over (default: every rank).
        memory: error feedback: a ``--memory`` flag (``"fp32"``, ``"plan:budget=0.25"``) or a
            :class:`hvdsketch.memory.Memory`; ``None`` for none. Its residuals are part of the
            optimizer's ``state_dict()``.
        collectives: ``"horovod"`` (Horovod's: NCCL and tensor fusion on GPUs) or ``"mpi"``
            (:mod:`hvdsketch.collectives.mpi`: every rank, no process set; GPU tensors go through host memory).
        error_if_nonfinite: ``False`` (the default): a NaN or Inf average is handed back, as Horovod's is,
            for a loss scaler to skip the step (``synchronize()``, ``scaler.unscale_(optimizer)``, then
            ``scaler.step(optimizer)`` inside ``skip_synchronize()``), hvdsketch's state kept as before it;
            ``True``: raise ``FloatingPointError`` on every rank.

    Returns:
        An instance of ``optimizer``'s own class over the same parameter groups, with Horovod's methods
        (``synchronize``, ``skip_synchronize``, ...) and ``report()``; with ``op=hvd.Adasum``, Horovod's optimizer.

    Raises:
        TypeError: ``optimizer`` not a ``torch.optim.Optimizer``, or one that Horovod's or hvdsketch's
            ``DistributedOptimizer`` already wrapped, or an argument of the wrong type.
        ValueError: a flag or option that is not valid, ``named_parameters`` that do not name every
            parameter once, or an ``op`` the compression cannot combine (Adasum).

    Example::

        hvd.init()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
        optimizer = hvdsketch.torch.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(), compression="sketch:error=0.5", memory="fp32")
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        loss_fn(model(x), y).backward()
        optimizer.step()
        print(optimizer.report())   # bytes sent against a dense allreduce
    """
    import horovod.torch as hvd

    from hvdsketch.torch import elastic

    _check_arguments(optimizer, backward_passes_per_step, gradient_predivide_factor, sparse_as_dense)
    op = hvd.Average if op is None else op
    if op not in (hvd.Average, hvd.Sum, hvd.Adasum):
        raise ValueError(f"hvdsketch: op must be hvd.Average, hvd.Sum or hvd.Adasum, got {op!r}")
    if gradient_predivide_factor != 1.0 and op != hvd.Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups:
        warnings.warn("Parameter `num_groups` has been replaced by `groups`.", DeprecationWarning)
        groups = num_groups if groups is None else groups
    policy = create_policy(compression)
    if op == hvd.Adasum:
        if str(policy) != "none" or memory is not None:
            raise ValueError(f"hvdsketch: op=hvd.Adasum combines the ranks' updates non-linearly, so it cannot "
                             f"combine compressed messages ({policy}{', memory ' + str(memory) if memory else ''}); "
                             f"use compression='none' without memory for Adasum, or op=hvd.Average")
        return hvd.DistributedOptimizer(optimizer, named_parameters=named_parameters,
                                        backward_passes_per_step=backward_passes_per_step, op=hvd.Adasum,
                                        sparse_as_dense=sparse_as_dense)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    named = convert.named(named_parameters)
    names = {id(p): name for name, p in named} if named is not None else {}
    if named is not None and (len(names) != len(params) or len({n for n, _ in named}) != len(named)
                              or not all(id(p) in names for p in params)):
        raise ValueError("hvdsketch: named_parameters must name every parameter of the optimizer once, "
                         "with unique names")
    by_param = {p: names.get(id(p), f"param.{i}") for i, p in enumerate(params)}
    communicator = _communicator(collectives, hvd, process_set, gradient_predivide_factor)
    session = Session(policy, memory, communicator, torch_ops, op="sum" if op == hvd.Sum else "average",
                      sparse_as_dense=sparse_as_dense, error_if_nonfinite=error_if_nonfinite)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    Distributed.register(cls)
    elastic.register(Distributed)
    return cls(optimizer.param_groups, by_param, session, backward_passes_per_step,
               _groups(groups, [p for p in params if p.requires_grad], by_param))
