"""torch.distributed's collectives as a communicator: hvdsketch without Horovod.

A round's messages are grouped as :mod:`~hvdsketch.collectives.grouping` groups them and started with
``async_op=True`` on a process group (the default one unless given), so a round travels while backward goes
on. By kind:

- floating-point ``average``, ``sum``, ``max``: one ``all_reduce`` per (op, dtype) of a fused flat buffer,
  ``average`` scaled by ``1 / N`` first, as DDP's reducer does (so a bucket comes back bit for bit as DDP's);
- ``allgather`` and ``bor``: one ``all_gather`` of every message's bytes (gloo's takes equal sizes: rows that
  differ by rank go padded to a learnt bound, rows past it in one more), a ``bor`` folded from the bitmaps;
- integer reductions, and at 2 ranks floating-point ones under :data:`GATHERED_BELOW` bytes: one
  ``all_gather`` reduced on each rank (``N - 1`` hops where an ``all_reduce`` takes ``2 (N - 1)``);
- ``alltoall``: ``all_to_all_single``; ``reduce_scatter``: ``reduce_scatter_tensor`` with ``ReduceOp.AVG``,
  FSDP's own reduction (so its results are FSDP's bit for bit).

Ranks match collectives by call order (``ordered``). Inside :meth:`TorchDistCommunicator.fusing` every start is
held and sent, fused, when the block ends. Over gloo a wait polls (:func:`poll`); with NCCL, host tensors are
staged through the current CUDA device. Bytes are counted as Horovod's communicator counts them.
"""
from __future__ import annotations

import collections
import contextlib
import math
import os
import resource
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
import torch.distributed as dist

from hvdsketch.collectives.grouping import KINDS, count_allreduce, count_alltoall, count_reduce_scatter, gathered, group
from hvdsketch.collectives.stats import CommStats
from hvdsketch.compress.base import Message


#: Floating-point allreduce groups below this many bytes go as an all_gather at 2 ranks (:meth:`_Launch._by_gather`).
GATHERED_BELOW = 1 << 20
#: An allgather's rows that differ by rank go padded to the most any rank sent in this many of its last launches.
BOUND_LAUNCHES = 16
#: How many times a wait over gloo may yield its core to another thread before it sleeps (:func:`poll`).
YIELDED_AWAY = 32


#: ``reduce_scatter_single`` (FSDP's), ``reduce_scatter_tensor`` before PyTorch 2.13 named it so.
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


def _integer(tensor: torch.Tensor) -> bool:
    return not (tensor.is_floating_point() or tensor.is_complex())


@dataclass
class _Held:
    """What a communicator and its side channels share: the open fusing block, held handles, unsettled launch."""

    open: bool = False
    handles: list["TorchDistHandle"] = field(default_factory=list)
    unsettled: "_Launch | None" = None


class _Launch:
    """The collectives of some messages in flight; :meth:`results` gives each message's raw result in order.

    Every rank issues them in one order: where every allgather whose rows differ by rank has a bound, one
    all_gather of counts, by-gather reductions and gathered rows (:meth:`_gather`), then the other allreduces;
    otherwise counts and by-gather reductions first (:meth:`_reduce_by_gather`), the other allreduces, then
    the gathered rows padded to the largest counts. Then each alltoall and reduce-scatter."""

    def __init__(self, communicator: "TorchDistCommunicator", messages: Sequence[Message],
                 names: Sequence[str]) -> None:
        self._communicator, self._messages = communicator, messages
        self._pending: list[tuple[list[int], Any, Any]] = []  # (indices, work or None, finish() -> their results)
        self._results: list[Any] | None = None
        #: Fetches the rows past their bounds and learns the next bounds (a bounded launch, until settled).
        self.settle: Callable[[], None] | None = None
        groups = group(messages)
        gathers = [i for (op, _), picked in groups.items() if op == "gather" for i in picked]
        varying = [i for i in gathers if messages[i].op == "allgather"]
        bounds = {i: communicator.bound(names[i]) for i in varying}
        bounded = bool(varying) and None not in bounds.values()
        by_gather = [key for key, picked in groups.items() if KINDS[messages[picked[0]].op] == "allreduce"
                     and self._by_gather([messages[i].tensor for i in picked], bool(varying) and not bounded)]
        counts = None  # every rank's row counts of ``varying``, where they travel first
        if bounded:
            self._gather(by_gather, groups, gathers, bounds, names)
        elif by_gather or varying:
            counts = self._reduce_by_gather(by_gather, groups, varying)
            communicator.learn({names[i]: [every[j] for every in counts] for j, i in enumerate(varying)})
        for (op, dtype), picked in groups.items():
            if KINDS[messages[picked[0]].op] == "allreduce" and (op, dtype) not in by_gather:
                self._allreduce(op, picked)
        if gathers and not bounded:
            exact = {i: max(every[j] for every in counts) for j, i in enumerate(varying)}
            self._gather([], groups, gathers, exact, names, counts or [])
        for (op, _), picked in groups.items():
            if op.startswith("alltoall"):
                self._alltoall(picked[0])
            elif op.startswith("reduce_scatter"):
                self._reduce_scatter(picked[0])

    def _by_gather(self, tensors: list[torch.Tensor], waited: bool) -> bool:
        """Whether an allreduce group goes in :meth:`_reduce_by_gather`'s all_gather: integers always (exact in
        any order); floating point at 2 ranks (``a + b`` is ``b + a``) under :data:`GATHERED_BELOW` bytes, unless
        ``waited`` (that all_gather carries row counts and is waited for at once)."""
        if all(_integer(t) for t in tensors):
            return True
        return self._communicator.size == 2 and not waited and sum(t.nbytes for t in tensors) < GATHERED_BELOW

    def _fused(self, keys: list[tuple[str, str]], groups: dict[tuple[str, str], list[int]]) -> list[torch.Tensor]:
        """Each allreduce group of ``keys`` as one flat tensor, a floating-point average scaled by ``1 / N``."""
        c = self._communicator
        fused = [torch.cat([c.staged(self._messages[i].tensor).reshape(-1) for i in groups[key]]) for key in keys]
        return [f * (1.0 / c.size) if key[0] == "average" and not _integer(f) else f for f, key in zip(fused, keys)]

    def _reduced(self, keys: list[tuple[str, str]], groups: dict[tuple[str, str], list[int]],
                 fused: list[torch.Tensor], every: Callable[[int, torch.dtype], torch.Tensor]) -> list[Any]:
        """The results of the groups ``keys`` gathered as ``fused``; ``every(k, dtype)`` is piece ``k``
        of every rank's bytes (``fused[k - 1]``'s), a row per rank."""
        c = self._communicator
        out = []
        for k, (key, flat) in enumerate(zip(keys, fused), start=1):
            ranks = every(k, flat.dtype)
            reduced = ranks.amax(0) if key[0] == "max" else ranks.sum(0, dtype=flat.dtype)
            if key[0] == "average" and _integer(flat):
                reduced = torch.div(reduced, c.size, rounding_mode="floor")
            members = groups[key]
            pieces = reduced.split([self._messages[i].tensor.numel() for i in members])
            out += [c.unstaged(piece.reshape(self._messages[i].tensor.shape), self._messages[i].tensor)
                    for piece, i in zip(pieces, members)]
        return out

    def _reduce_by_gather(self, keys: list[tuple[str, str]], groups: dict[tuple[str, str], list[int]],
                          varying: list[int]) -> list[list[int]]:
        """The allreduce groups ``keys`` and the row counts of the allgathers ``varying`` as one all_gather,
        reduced here; where there are counts it is waited for at once and they are returned (rank order)."""
        c = self._communicator
        fused = self._fused(keys, groups)
        device = fused[0].device if fused else c.staged(self._messages[varying[0]].tensor).device
        mine = [torch.tensor([self._messages[i].tensor.shape[0] for i in varying], dtype=torch.int64, device=device)]
        sizes = [t.numel() * t.element_size() for t in mine + fused]
        parts = [torch.empty(sum(sizes), dtype=torch.uint8, device=device) for _ in range(c.size)]
        work = None if not sum(sizes) else dist.all_gather(
            parts, torch.cat([t.view(torch.uint8) for t in mine + fused]), group=c.group, async_op=True)

        def every(k: int, dtype: torch.dtype) -> torch.Tensor:
            """Piece ``k`` of every rank's bytes, a row per rank, in ``dtype``."""
            return torch.stack([part.split(sizes)[k] for part in parts]).view(dtype)

        counts: list[list[int]] = []
        if varying:
            c.wait(work)
            counts = every(0, torch.int64).cpu().tolist()
        if keys:
            self._pending.append(([i for key in keys for i in groups[key]], work,
                                  lambda: self._reduced(keys, groups, fused, every)))
        return counts

    def _gather(self, keys: list[tuple[str, str]], groups: dict[tuple[str, str], list[int]], gathers: list[int],
                bounds: dict[int, int], names: Sequence[str], counts: list[list[int]] | None = None) -> None:
        """One all_gather of the row counts of ``bounds`` (index: rows), the allreduce groups ``keys`` and every
        gathered message, each of ``bounds`` cut or zero-padded to its bound. ``counts``: every rank's counts,
        where they travelled first; otherwise the bounds are learnt and :attr:`settle` fetches rows past them."""
        c = self._communicator
        fused = self._fused(keys, groups)
        tensors = {i: c.staged(self._messages[i].tensor).contiguous() for i in gathers}
        row_bytes = {i: math.prod(t.shape[1:]) * t.element_size() for i, t in tensors.items()}
        device = tensors[gathers[0]].device
        head = [torch.tensor([tensors[i].shape[0] for i in bounds], dtype=torch.int64, device=device)] + fused
        sizes = [t.numel() * t.element_size() for t in head]
        spans = [bounds.get(i, tensors[i].shape[0]) * row_bytes[i] for i in gathers]
        pieces = [t.view(torch.uint8) for t in head]
        for i, span in zip(gathers, spans):
            kept = tensors[i].reshape(-1).view(torch.uint8)[:span]
            pieces += [kept, torch.zeros(span - kept.numel(), dtype=torch.uint8, device=device)]
        mine = torch.cat(pieces)
        parts = [torch.empty_like(mine) for _ in range(c.size)]
        work = dist.all_gather(parts, mine, group=c.group, async_op=True) if mine.numel() else None
        every_count: list[list[int]] = list(counts or [])  # every rank's row counts, once known
        past: list[torch.Tensor] = []  # every rank's rows past their bounds, where any rank had some

        def settle() -> None:
            c.wait(work)
            every_count.extend(part[:sizes[0]].view(torch.int64).cpu().tolist() for part in parts)
            over = [[max(0, n - bounds[i]) * row_bytes[i] for n, i in zip(ns, bounds)] for ns in every_count]
            if any(map(sum, over)):
                extra = torch.zeros(max(map(sum, over)), dtype=torch.uint8, device=device)
                if sum(over[c.rank]):
                    torch.cat([tensors[i].reshape(-1).view(torch.uint8)[bounds[i] * row_bytes[i]:] for i in bounds],
                              out=extra[:sum(over[c.rank])])
                past.extend(torch.empty_like(extra) for _ in range(c.size))
                c.wait(dist.all_gather(past, extra, group=c.group, async_op=True))
            c.learn({names[i]: [ns[j] for ns in every_count] for j, i in enumerate(bounds)})

        def every(k: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.stack([part[:sum(sizes)].split(sizes)[k] for part in parts]).view(dtype)

        def finish() -> list[Any]:
            rows: list[list[torch.Tensor]] = [[] for _ in gathers]
            for r, part in enumerate(parts):
                bodies = part[sum(sizes):].split(spans)
                sent = dict(zip(bounds, every_count[r] if bounds else []))
                over = [max(0, sent[i] - bounds[i]) * row_bytes[i] for i in bounds]
                beyond = iter((past[r] if past else part)[:sum(over)].split(over))
                for k, (i, body) in enumerate(zip(gathers, bodies)):
                    rows[k].append(body[:min(sent[i], bounds[i]) * row_bytes[i]] if i in bounds else body)
                    if i in bounds:
                        rows[k].append(next(beyond))
            total = {i: sum(ns[j] for ns in every_count) for j, i in enumerate(bounds)}
            gathered = [c.unstaged(torch.cat(p).view(tensors[i].dtype).reshape(
                total.get(i, c.size * tensors[i].shape[0]), *tensors[i].shape[1:]), self._messages[i].tensor)
                for p, i in zip(rows, gathers)]
            return self._reduced(keys, groups, fused, every) + gathered

        if counts is None:
            self.settle = settle
        self._pending.append(([i for key in keys for i in groups[key]] + gathers, work, finish))

    def _allreduce(self, op: str, picked: list[int]) -> None:
        """One fused allreduce of ``picked`` (floating point: see :meth:`_by_gather`)."""
        c = self._communicator
        tensors = [c.staged(self._messages[i].tensor) for i in picked]
        fused = torch.cat([t.reshape(-1) for t in tensors])
        if op == "average":
            fused.mul_(1.0 / c.size)
        work = None if fused.numel() == 0 else dist.all_reduce(
            fused, dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=c.group, async_op=True)

        def finish() -> list[Any]:
            return [c.unstaged(piece.reshape(t.shape), self._messages[i].tensor)
                    for piece, t, i in zip(fused.split([t.numel() for t in tensors]), tensors, picked)]

        self._pending.append((picked, work, finish))

    def _alltoall(self, i: int) -> None:
        c = self._communicator
        tensor, splits = c.staged(self._messages[i].tensor), list(self._messages[i].splits)
        incoming = self._messages[i].received
        if incoming is None:
            sending = torch.tensor(splits, dtype=torch.int64, device=tensor.device)
            receiving = torch.empty_like(sending)
            dist.all_to_all_single(receiving, sending, group=c.group)
            incoming = receiving.cpu().tolist()
        incoming = list(incoming)
        received = tensor.new_empty((sum(incoming), *tensor.shape[1:]))
        work = dist.all_to_all_single(received, tensor, incoming, splits, group=c.group, async_op=True)
        self._pending.append(([i], work, lambda: [c.unstaged(received, self._messages[i].tensor)]))

    def _reduce_scatter(self, i: int) -> None:
        c = self._communicator
        tensor = c.staged(self._messages[i].tensor)
        received = tensor.new_empty((tensor.shape[0] // c.size, *tensor.shape[1:]))
        work = _REDUCE_SCATTER(received, tensor, op=dist.ReduceOp.AVG, group=c.group, async_op=True)
        if c.polling:
            work = _Unreported(work)
        self._pending.append(([i], work, lambda: [c.unstaged(received, self._messages[i].tensor)]))

    def test(self) -> bool:
        return all(work is None or work.is_completed() for _, work, _ in self._pending)

    def results(self) -> list[Any]:
        if self._results is None:
            self._communicator.settle(self)
            out: list[Any] = [None] * len(self._messages)
            for picked, work, finish in self._pending:
                self._communicator.wait(work)
                for i, result in zip(picked, finish()):
                    out[i] = result
            self._results = out
        return self._results


class _Unreported:
    """A gloo reduce-scatter in flight: waited, never polled (gloo reports it completed only once waited)."""

    def __init__(self, work: Any) -> None:
        self.work = work

    def is_completed(self) -> bool:
        return False

    def wait(self) -> None:
        self.work.wait()


class TorchDistHandle:
    """One :meth:`TorchDistCommunicator.start` call's messages: held, or part of a launch in flight."""

    def __init__(self, communicator: "TorchDistCommunicator", messages: Sequence[Message], name: str) -> None:
        self._communicator, self.messages, self.name = communicator, list(messages), name
        self.launch: _Launch | None = None
        self.offset = 0  # where this call's messages begin in the launch's
        self._results: list[Any] | None = None

    def test(self) -> bool:
        if self._results is not None:
            return True
        return self.launch is not None and not self._communicator.held.open and self.launch.test()

    def wait(self) -> list[Any]:
        if self._results is None:
            if self.launch is None:
                self._communicator.flush()
            raw = self.launch.results()[self.offset:self.offset + len(self.messages)]
            self._results = self._communicator.counted(self.messages, raw)
        return self._results


class TorchDistCommunicator:
    """Reduce messages over ``group``, a ``torch.distributed`` process group (the default group if
    ``None``); see the module docstring."""

    #: Ranks match collectives by the order of calls: the exchanger launches rounds in one order.
    ordered = True

    def __init__(self, group: Any = None) -> None:
        if not dist.is_initialized():
            raise RuntimeError("hvdsketch: torch.distributed is not initialized; call "
                               "torch.distributed.init_process_group first (torchrun sets the environment)")
        self.group = group
        self.stats = CommStats()
        self.held = _Held()
        #: By message (its start's name and place): the most rows a rank sent in each of its last launches.
        self._seen: dict[str, collections.deque[int]] = {}
        backend = dist.get_backend(group)
        #: Whether :meth:`wait` polls (gloo, whose collectives complete on its own threads).
        self.polling = backend == "gloo"
        nccl = backend == "nccl"
        #: Where host tensors travel through (NCCL takes device tensors only), or ``None``.
        self.staging = torch.device("cuda", torch.cuda.current_device()) if nccl else None

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group)

    @property
    def size(self) -> int:
        return dist.get_world_size(self.group)

    def start(self, messages: Sequence[Message], name: str = "") -> TorchDistHandle:
        """Start reducing each message by its op (``name`` only labels: ranks match by call order)."""
        group(messages)  # an unknown op raises here, before anything is sent or held
        handle = TorchDistHandle(self, messages, name)
        self.held.handles.append(handle)
        if not self.held.open:
            self.flush()
        return handle

    @contextlib.contextmanager
    def fusing(self) -> Iterator[None]:
        """Hold every start inside the block and send the held messages together when it ends (one
        collective per (op, dtype)); no handle reports itself done while it is open."""
        if self.held.open:
            raise RuntimeError("hvdsketch: fusing blocks do not nest")
        self.held.open = True
        try:
            yield
        finally:
            self.held.open = False
            self.flush()

    def flush(self) -> None:
        """Send every held message, in the order they were started (the last launch settled first)."""
        handles, self.held.handles = self.held.handles, []
        if not handles:
            return
        self.settle()
        launch = _Launch(self, [m for handle in handles for m in handle.messages],
                         [f"{handle.name}#{j}" for handle in handles for j in range(len(handle.messages))])
        self.held.unsettled = launch if launch.settle is not None else None
        offset = 0
        for handle in handles:
            handle.launch, handle.offset = launch, offset
            offset += len(handle.messages)

    def settle(self, launch: _Launch | None = None) -> None:
        """Settle the last launch (only if it is ``launch``, where given) if bounded and unsettled: its rows
        past their bounds go in one more all_gather, on every rank right after it and before any later one."""
        unsettled = self.held.unsettled
        if unsettled is not None and launch in (None, unsettled):
            self.held.unsettled = None
            unsettled.settle()

    def learn(self, counts: Mapping[str, list[int]]) -> None:
        """Learn the next bounds of the allgathers in ``counts`` (every rank's row count): the most rows any
        rank sent in the last :data:`BOUND_LAUNCHES` launches."""
        for name, ns in counts.items():
            self._seen.setdefault(name, collections.deque(maxlen=BOUND_LAUNCHES)).append(max(ns))

    def bound(self, name: str) -> int | None:
        """The rows the allgather ``name`` goes padded to (see :meth:`learn`); ``None`` before its first launch."""
        seen = self._seen.get(name)
        return max(seen) if seen else None

    def counted(self, messages: Sequence[Message], raw: Sequence[Any]) -> list[Any]:
        """One start call's results from its raw ones, its bytes counted as Horovod's communicator counts them."""
        out = list(raw)
        for (op, _), picked in group(messages).items():
            if op.startswith("alltoall"):
                count_alltoall(self.stats, messages[picked[0]], out[picked[0]], self.rank)
            elif op.startswith("reduce_scatter"):
                count_reduce_scatter(self.stats, messages[picked[0]], self.size)
            elif op != "gather":
                count_allreduce(self.stats, op, [messages[i] for i in picked], self.size)
            else:
                for i in picked:
                    out[i] = gathered(self.stats, messages[i], out[i], self.size)
        return out

    def wait(self, work: Any) -> None:
        """Wait for ``work`` (``None``: nothing in flight); over gloo poll it first (:func:`poll`), not over NCCL,
        whose ``wait`` only orders streams."""
        if work is None:
            return
        if self.polling and not isinstance(work, _Unreported):
            poll(work)
        work.wait()

    def staged(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` where the process group can send it (a host tensor on the CUDA device for NCCL)."""
        return tensor.to(self.staging) if self.staging is not None and tensor.device.type == "cpu" else tensor

    @staticmethod
    def unstaged(result: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """``result`` back on the device of the message it answers."""
        return result if result.device == like.device else result.to(like.device)


def poll(work: Any) -> None:
    """Poll ``work`` until it completes, yielding the core between polls (gloo completes it on its own threads,
    which a sleeping waiter would leave waiting to wake it). Returns early, for the caller to sleep in
    ``work.wait()``, once the core went to others more than :data:`YIELDED_AWAY` times (a rank shares it)."""
    away = _switched_away() + YIELDED_AWAY
    polls = 0
    while not work.is_completed() and (polls % 64 or _switched_away() <= away):
        os.sched_yield()
        polls += 1


def _switched_away() -> int:
    """How many times this thread was switched away from while runnable (yields to other threads, preemptions)."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw
