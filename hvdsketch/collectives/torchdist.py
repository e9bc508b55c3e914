"""torch.distributed's collectives as a communicator: hvdsketch without Horovod.

A round's messages are grouped as Horovod's communicator groups them
(:mod:`~hvdsketch.collectives.grouping`) and started with ``async_op=True`` on
a process group (the default one unless given), so :meth:`Handle.test` polls
``work.is_completed()`` and the round travels while backward goes on:

- ``average``, ``sum``, ``max``: one ``all_reduce`` per (op, dtype) of the
  messages fused into one flat buffer. ``average`` scales by ``1 / N`` before
  the sum, as DDP's own reducer does (so a bucket's gradients fused in the
  bucket's layout come back bit for bit as DDP's), and integers are summed,
  then floor-divided.
- ``allgather`` (row counts may differ by rank): the row counts of the round's
  allgathers first, in one small ``all_gather`` waited for at once (gloo's
  ``all_gather`` takes equal sizes only), then each message padded to the most
  rows, gathered, and trimmed.
- ``bor``: an ``all_gather`` of the equal-sized bitmaps folded with bitwise OR, as
  Horovod's communicator does (so bytes compare with it).
- ``alltoall``: ``all_to_all_single`` with the message's splits as input splits,
  the output splits exchanged first by a small ``all_to_all_single`` waited for at once.

Bytes are counted by the same formulas as Horovod's communicator's, one record
per :meth:`TorchDistCommunicator.start` call.

torch.distributed matches collectives by the order of calls, not by name
(``ordered``): the exchanger launches rounds in one order on every rank
(:mod:`~hvdsketch.exchange.ordering`), and the few collectives this layer itself
waits for in :meth:`~TorchDistCommunicator.start` (row counts, splits) are
issued in that order too. Inside :meth:`TorchDistCommunicator.fusing` (the
DDP hook wraps each bucket's exchanges in it) every start is held and the held
messages go out together when the block ends, fused by (op, dtype): one bucket
of dense gradients is one allreduce, as in DDP. So that what goes out inside a
block is the same on every rank, no handle reports itself done while a block is
open (nothing advances to a later round on one rank's timing); a ``wait()``
inside a block sends what is held first.

Tensors travel on their own device. With NCCL, host tensors (the exchanger's
step tag and checks) are staged through the current CUDA device.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch
import torch.distributed as dist

from hvdsketch.collectives.grouping import KINDS, count_allreduce, count_alltoall, gathered, group
from hvdsketch.collectives.stats import CommStats
from hvdsketch.compress.base import Message


@dataclass
class _Held:
    """What a communicator and its side channels (copies of it) share: whether a fusing block is
    open, and the handles it holds."""

    open: bool = False
    handles: list["TorchDistHandle"] = field(default_factory=list)


class _Launch:
    """The collectives of some messages in flight; :meth:`results` gives each message's raw
    result in order (allreduced slices, gathered rows, alltoall's received rows)."""

    def __init__(self, communicator: "TorchDistCommunicator", messages: Sequence[Message]) -> None:
        self._communicator, self._messages = communicator, messages
        self._pending: list[tuple[list[int], Any, Any]] = []  # (indices, work or None, finish() -> their results)
        self._results: list[Any] | None = None
        for (op, _), picked in group(messages).items():
            if KINDS[messages[picked[0]].op] == "allreduce":
                self._allreduce(op, picked)
            elif op == "gather":
                self._gather(picked)
            else:
                self._alltoall(picked[0])

    def _allreduce(self, op: str, picked: list[int]) -> None:
        c = self._communicator
        tensors = [c.staged(self._messages[i].tensor) for i in picked]
        fused = torch.cat([t.reshape(-1) for t in tensors])
        floating = fused.is_floating_point()
        if op == "average" and floating:
            fused.mul_(1.0 / c.size)
        work = None if fused.numel() == 0 else dist.all_reduce(
            fused, dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=c.group, async_op=True)

        def finish() -> list[Any]:
            summed = torch.div(fused, c.size, rounding_mode="floor") if op == "average" and not floating else fused
            pieces = summed.split([t.numel() for t in tensors])
            return [c.unstaged(piece.reshape(t.shape), self._messages[i].tensor)
                    for piece, t, i in zip(pieces, tensors, picked)]

        self._pending.append((picked, work, finish))

    def _gather(self, picked: list[int]) -> None:
        c = self._communicator
        tensors = [c.staged(self._messages[i].tensor) for i in picked]
        varying = [k for k, i in enumerate(picked) if self._messages[i].op == "allgather"]
        rows = {k: [tensors[k].shape[0]] * c.size for k in range(len(picked))}
        if varying:  # the row counts of every allgather of the round, at once
            mine = torch.tensor([tensors[k].shape[0] for k in varying], dtype=torch.int64, device=tensors[0].device)
            counts = [torch.empty_like(mine) for _ in range(c.size)]
            dist.all_gather(counts, mine, group=c.group)
            every = torch.stack(counts).cpu().tolist()
            rows.update({k: [every[r][j] for r in range(c.size)] for j, k in enumerate(varying)})
        for k, i in enumerate(picked):
            tensor, most = tensors[k], max(rows[k])
            padded = tensor
            if tensor.shape[0] != most:
                padded = tensor.new_zeros((most, *tensor.shape[1:]))
                padded[:tensor.shape[0]] = tensor
            parts = [torch.empty_like(padded) for _ in range(c.size)]
            work = None if padded.numel() == 0 else dist.all_gather(parts, padded, group=c.group, async_op=True)

            def finish(parts=parts, counts=rows[k], like=self._messages[i].tensor) -> list[Any]:
                return [c.unstaged(torch.cat([part[:n] for part, n in zip(parts, counts)]), like)]

            self._pending.append(([i], work, finish))

    def _alltoall(self, i: int) -> None:
        c = self._communicator
        tensor, splits = c.staged(self._messages[i].tensor), list(self._messages[i].splits)
        sending = torch.tensor(splits, dtype=torch.int64, device=tensor.device)
        receiving = torch.empty_like(sending)
        dist.all_to_all_single(receiving, sending, group=c.group)
        incoming = receiving.cpu().tolist()
        received = tensor.new_empty((sum(incoming), *tensor.shape[1:]))
        work = dist.all_to_all_single(received, tensor, incoming, splits, group=c.group, async_op=True)
        self._pending.append(([i], work, lambda: [c.unstaged(received, self._messages[i].tensor)]))

    def test(self) -> bool:
        return all(work is None or work.is_completed() for _, work, _ in self._pending)

    def results(self) -> list[Any]:
        if self._results is None:
            out: list[Any] = [None] * len(self._messages)
            for picked, work, finish in self._pending:
                if work is not None:
                    work.wait()
                for i, result in zip(picked, finish()):
                    out[i] = result
            self._results = out
        return self._results


class TorchDistHandle:
    """One :meth:`TorchDistCommunicator.start` call's messages: held, or part of a launch in flight."""

    def __init__(self, communicator: "TorchDistCommunicator", messages: Sequence[Message]) -> None:
        self._communicator, self.messages = communicator, list(messages)
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
        nccl = dist.get_backend(group) == "nccl"
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
        handle = TorchDistHandle(self, messages)
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
        """Send every held message, in the order they were started."""
        handles, self.held.handles = self.held.handles, []
        if not handles:
            return
        launch = _Launch(self, [m for handle in handles for m in handle.messages])
        offset = 0
        for handle in handles:
            handle.launch, handle.offset = launch, offset
            offset += len(handle.messages)

    def counted(self, messages: Sequence[Message], raw: Sequence[Any]) -> list[Any]:
        """One start call's results from its raw ones, its bytes counted as Horovod's communicator
        counts them (per group of that call)."""
        out = list(raw)
        for (op, _), picked in group(messages).items():
            if op.startswith("alltoall"):
                count_alltoall(self.stats, messages[picked[0]], out[picked[0]], self.rank)
            elif op != "gather":
                count_allreduce(self.stats, op, [messages[i] for i in picked], self.size)
            else:
                for i in picked:
                    out[i] = gathered(self.stats, messages[i], out[i], self.size)
        return out

    def staged(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` where the process group can send it (a host tensor on the CUDA device for NCCL)."""
        return tensor.to(self.staging) if self.staging is not None and tensor.device.type == "cpu" else tensor

    @staticmethod
    def unstaged(result: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """``result`` back on the device of the message it answers."""
        return result if result.device == like.device else result.to(like.device)
