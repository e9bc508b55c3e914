"""Horovod's collectives as a communicator, for either framework.

A round's messages are grouped by kind and dtype (:mod:`~hvdsketch.collectives.grouping`; Horovod's grouped ops
take one dtype) and go through ``hvd.grouped_allreduce``, ``hvd.grouped_allgather`` (``bor`` is an allgather
folded with OR: Horovod has no bitwise reduction) or ``hvd.alltoall`` (there is no grouped one). Collectives are
named from the round's name, so ranks match them by name and Horovod's response cache holds them step after
step. With PyTorch each group starts asynchronously and :meth:`HorovodHandle.test` polls it; with TensorFlow
the ops are scheduled by TensorFlow.
"""
from __future__ import annotations

import re
from types import ModuleType
from typing import Any, Sequence

from hvdsketch.collectives.grouping import count_allreduce, count_alltoall, gathered, group
from hvdsketch.collectives.stats import CommStats
from hvdsketch.compress.base import Message


class HorovodHandle:
    """The groups of one round in flight; :meth:`wait` returns the results in message order."""

    def __init__(self, communicator: "HorovodCommunicator", messages: Sequence[Message],
                 started: list[tuple[str, list[int], Any]]) -> None:
        self._communicator, self._messages, self._started = communicator, messages, started
        self._results: list[Any] | None = None

    def test(self) -> bool:
        hvd = self._communicator.hvd
        return self._results is not None or not self._communicator.asynchronous or all(
            hvd.poll(handle) for _, _, handle in self._started)

    def wait(self) -> list[Any]:
        if self._results is None:
            self._results = self._communicator.collect(self._messages, self._started)
        return self._results


#: What the message of a TensorFlow op error says where a Horovod collective failed (a rank left).
HOROVOD_FAILURE = re.compile(r"Horovod(Grouped)?(Allreduce|Allgather|Alltoall|Broadcast)|Horovod has been shut down")


def horovod_failed(error: BaseException) -> bool:
    """Whether ``error`` is TensorFlow's error of a failed Horovod collective (a rank left), to re-raise as
    ``HorovodInternalError`` naming ``HorovodAllreduce``: Horovod 0.28.1's TensorFlow ``hvd.elastic.run``
    recovers only where the text names an ungrouped collective."""
    return type(error).__name__ == "UnknownError" and bool(HOROVOD_FAILURE.search(str(error)))


class HorovodCommunicator:
    """Reduce messages with ``hvd`` (``horovod.torch`` or ``horovod.tensorflow``) over ``process_set`` (the global
    set if ``None``); ``average`` is scaled by ``1 / predivide`` before the sum and ``predivide / size`` after."""

    def __init__(self, hvd: ModuleType, process_set: Any = None, predivide: float = 1.0) -> None:
        self.hvd = hvd
        self.process_set = process_set if process_set is not None else hvd.global_process_set
        self.predivide = predivide
        self.stats = CommStats()
        #: True with PyTorch, whose collectives return handles to poll and wait for.
        self.asynchronous = hasattr(hvd, "grouped_allgather_async")

    @property
    def rank(self) -> int:
        return self.process_set.rank()

    @property
    def size(self) -> int:
        return self.process_set.size()

    def start(self, messages: Sequence[Message], name: str) -> HorovodHandle:
        started = [(op, picked, self._start(op, [messages[i] for i in picked], f"{name}.{op}.{dtype}"))
                   for (op, dtype), picked in group(messages).items()]
        return HorovodHandle(self, messages, started)

    def _start(self, op: str, messages: list[Message], name: str) -> Any:
        """A handle of the group's collective (PyTorch), or its results (TensorFlow, whose op names
        take letters, digits and ``_`` only, outside any name scope)."""
        hvd, kwargs = self.hvd, {"name": name, "process_set": self.process_set}
        tensors = [m.tensor for m in messages]
        if not self.asynchronous:
            kwargs.update(name=re.sub("[^a-zA-Z0-9_]", "_", name), ignore_name_scope=True)
        if op.startswith("reduce_scatter"):
            raise ValueError("hvdsketch: Horovod's communicator has no reduce-scatter (FSDP's reduction, which "
                             "hvdsketch.torch.fsdp runs over torch.distributed)")
        if op.startswith("alltoall"):
            (tensors,), collective = tensors, hvd.alltoall_async if self.asynchronous else hvd.alltoall
            kwargs["splits"] = list(messages[0].splits)
        elif op == "gather":
            collective = hvd.grouped_allgather_async if self.asynchronous else hvd.grouped_allgather
        else:
            kwargs["op"] = {"average": hvd.Average, "sum": hvd.Sum, "max": hvd.Max}[op]
            if op == "average" and self.predivide != 1.0:
                kwargs.update(prescale_factor=1.0 / self.predivide, postscale_factor=self.predivide)
            collective = hvd.grouped_allreduce_async if self.asynchronous else hvd.grouped_allreduce
        try:
            return collective(tensors, **kwargs)
        except Exception as error:
            if horovod_failed(error):
                from horovod.common.exceptions import HorovodInternalError

                raise HorovodInternalError(f"hvdsketch: a Horovod collective failed (HorovodAllreduce / "
                                           f"HorovodAllgather of {name!r}): {error}") from error
            raise

    def collect(self, messages: Sequence[Message], started: list[tuple[str, list[int], Any]]) -> list[Any]:
        """Wait for every group of a round and count its bytes; the results in message order."""
        out: list[Any] = [None] * len(messages)
        for op, picked, handle in started:
            results = self.hvd.synchronize(handle) if self.asynchronous else handle
            if op.startswith("alltoall"):
                (i,), (received, _) = picked, results
                out[i] = received
                count_alltoall(self.stats, messages[i], received, self.rank)
            elif op != "gather":
                count_allreduce(self.stats, op, [messages[i] for i in picked], self.size)
                for i, result in zip(picked, results):
                    out[i] = result
            else:
                for i, rows in zip(picked, results):
                    out[i] = gathered(self.stats, messages[i], rows, self.size)
        return out
