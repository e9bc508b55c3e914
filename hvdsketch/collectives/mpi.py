"""hvdsketch's own collectives on mpi4py, every byte on the wire counted.

Horovod has no bitwise-OR reduction, no allgather of per-rank sizes without padding and no narrower wire
format; this layer has them, on a duplicate of ``COMM_WORLD`` (never Horovod's, so it is safe beside Horovod's
background thread: both ask for ``MPI_THREAD_MULTIPLE``). Every schedule is built from point-to-point
messages, so :class:`~hvdsketch.collectives.stats.CommStats` records their exact payload bytes. A schedule is a
generator that yields the requests of the messages it posted and is resumed once they have completed::

    def schedule(wire):
        incoming = np.empty_like(mine)
        yield wire.irecv([incoming], left) + wire.isend([mine], right)
        return mine + incoming

Every collective is non-blocking (a :class:`Handle`); waiting on any handle moves every collective in flight,
so handles may be waited for in any order. As with MPI, leave the inputs untouched until ``wait()`` returns.
The dense schedules are :func:`ring_allreduce`, :func:`allgatherv` and :func:`alltoallv`; the sparse ones are in
:mod:`hvdsketch.collectives.sparse`. :class:`MPICommunicator` also implements the
:class:`~hvdsketch.collectives.Communicator` protocol (``collectives="mpi"``) for numpy arrays and any
back-end's tensors (host tensors as numpy views, accelerator ones staged through host memory); ranks match its
collectives by the order of calls (``ordered``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generator, Generic, Sequence, TypeVar

import numpy as np
from mpi4py import MPI

from hvdsketch.collectives.stats import CommStats
from hvdsketch.compress.base import Message
from hvdsketch.digests import crc
from hvdsketch.ops import backend

T = TypeVar("T")
#: A collective: yields the requests of each round of messages, returns its result.
Schedule = Generator[list, None, T]

REDUCTIONS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "sum": np.add, "max": np.maximum, "bor": np.bitwise_or,
}
#: Message op of the communicator protocol -> element-wise reduction.
PROTOCOL_REDUCTIONS = {"average": "sum", "sum": "sum", "max": "max", "bor": "bor"}
#: Message ops that move rows rather than reduce them, one collective a message.
GATHERS = ("allgather", "alltoall")


# --- wire formats --------------------------------------------------------------------------


def _bf16_encode(x: np.ndarray) -> np.ndarray:
    """float -> bfloat16 bits (uint16), rounded to nearest even: add half an ulp of the
    kept 16 bits (less one when the kept part is even) and truncate; NaN stays NaN."""
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    bits = x32.view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x32), np.uint16(0x7FC0), rounded)


def _bf16_decode(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


@dataclass(frozen=True)
class WireFormat:
    """How floats travel: ``encode`` gives what is sent, ``decode`` turns it back into numbers."""

    name: str
    dtype: np.dtype
    encode: Callable[[np.ndarray], np.ndarray]
    decode: Callable[[np.ndarray], np.ndarray]


def _cast_format(dtype: np.dtype) -> WireFormat:
    dtype = np.dtype(dtype)
    return WireFormat(dtype.name, dtype, lambda x: np.ascontiguousarray(x, dtype=dtype), lambda b: b)


WIRE_FORMATS: dict[str, WireFormat] = {
    "float32": _cast_format(np.dtype(np.float32)),
    "float16": _cast_format(np.dtype(np.float16)),
    "bfloat16": WireFormat("bfloat16", np.dtype(np.uint16), _bf16_encode, _bf16_decode),
}


def wire_format(name: str | None, dtype: np.dtype) -> WireFormat:
    """The format called ``name``, or ``dtype`` itself as it is (``None``)."""
    if name is None:
        return _cast_format(dtype)
    if name not in WIRE_FORMATS:
        raise ValueError(f"hvdsketch: unknown wire format {name!r}; valid: {', '.join(WIRE_FORMATS)}")
    if not np.issubdtype(dtype, np.floating):
        raise ValueError(f"hvdsketch: wire format {name!r} needs floating values, got {np.dtype(dtype)}")
    return WIRE_FORMATS[name]


# --- messages, handles, progress -----------------------------------------------------------


class Wire:
    """The point-to-point messages of one collective call: one tag, every byte counted."""

    def __init__(self, comm: MPI.Intracomm, tag: int) -> None:
        self.comm, self.tag = comm, tag
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.sent = self.received = 0

    def isend(self, arrays: Sequence[np.ndarray], dest: int) -> list[MPI.Request]:
        self.sent += sum(a.nbytes for a in arrays)
        return [self.comm.Isend([_contiguous(a), MPI.BYTE], dest, self.tag) for a in arrays]

    def irecv(self, arrays: Sequence[np.ndarray], source: int) -> list[MPI.Request]:
        self.received += sum(a.nbytes for a in arrays)
        return [self.comm.Irecv([_contiguous(a), MPI.BYTE], source, self.tag) for a in arrays]


def _contiguous(a: np.ndarray) -> np.ndarray:
    if not a.flags.c_contiguous:
        raise ValueError("hvdsketch: MPI buffers must be C-contiguous")
    return a


class _Progress:
    """Moves every collective in flight on one communicator, so none waits on another's step."""

    def __init__(self) -> None:
        self.active: list[Handle] = []

    def poll(self, block: bool) -> None:
        handles = list(self.active)
        requests = [r for h in handles for r in h._requests]
        (MPI.Request.Waitsome if block else MPI.Request.Testsome)(requests)
        for h in handles:
            if MPI.Request.Testall(h._requests):
                h._advance()


class Handle(Generic[T]):
    """A collective in flight: ``test()`` moves it on without blocking, ``wait()`` returns its result."""

    def __init__(self, progress: _Progress, schedule: Schedule[T], on_done: Callable[[], None]) -> None:
        self._progress, self._schedule, self._on_done = progress, schedule, on_done
        self._requests: list[MPI.Request] = []
        self._done = False
        self._result: T | None = None
        progress.active.append(self)
        self._advance()

    def _advance(self) -> None:
        """Run the schedule's local work up to its next posted messages, or to its end."""
        self._requests = []
        try:
            while not self._requests:
                self._requests = self._schedule.send(None)
        except StopIteration as end:
            self._result = end.value
            self._finish()
            self._on_done()
        except BaseException:
            self._finish()
            raise

    def _finish(self) -> None:
        self._done, self._requests = True, []
        self._progress.active.remove(self)

    def test(self) -> bool:
        """Move every collective in flight a step if its messages have arrived; True once this one is done."""
        if not self._done:
            self._progress.poll(block=False)
        return self._done

    def wait(self) -> T:
        while not self._done:
            self._progress.poll(block=True)
        return self._result  # type: ignore[return-value]


class Batch(Generic[T]):
    """Several handles finished as one: ``wait()`` returns ``combine`` of their results."""

    def __init__(self, handles: Sequence[Handle], combine: Callable[[list[Any]], T]) -> None:
        self._handles, self._combine = list(handles), combine

    def test(self) -> bool:
        return all([h.test() for h in self._handles])

    def wait(self) -> T:
        return self._combine([h.wait() for h in self._handles])


# --- dense schedules -----------------------------------------------------------------------


def chunk_bounds(n: int, size: int) -> np.ndarray:
    """Offsets of the ``size`` ring chunks of ``n`` elements (the first ``n % size`` one longer)."""
    base, longer = divmod(n, size)
    return np.concatenate([[0], np.cumsum([base + (i < longer) for i in range(size)])]).astype(np.int64)


def ring_allreduce(wire: Wire, x: np.ndarray, op: str = "sum", fmt: WireFormat | None = None) -> Schedule[np.ndarray]:
    """Element-wise ``op`` of ``x`` over all ranks: reduce-scatter then allgather around a ring (Patarasuk &
    Yuan, 2009), about ``2 (N - 1) / N`` of the buffer each way; values are rounded to ``fmt`` at every hop."""
    combine = REDUCTIONS[op]
    fmt = fmt or wire_format(None, x.dtype)
    acc = np.array(x, copy=True).reshape(-1)
    bounds, r, size = chunk_bounds(acc.size, wire.size), wire.rank, wire.size
    right, left = (r + 1) % size, (r - 1) % size

    def chunk(i: int) -> slice:
        i %= size
        return slice(bounds[i], bounds[i + 1])

    def shift(send: int, recv: int) -> Schedule[np.ndarray]:
        incoming = np.empty(bounds[recv % size + 1] - bounds[recv % size], fmt.dtype)
        yield wire.irecv([incoming], left) + wire.isend([fmt.encode(acc[chunk(send)])], right)
        return fmt.decode(incoming)

    for k in range(size - 1):
        incoming = yield from shift(r - k, r - k - 1)
        acc[chunk(r - k - 1)] = combine(acc[chunk(r - k - 1)], incoming)
    acc[chunk(r + 1)] = fmt.decode(fmt.encode(acc[chunk(r + 1)]))  # every rank ends with wire-rounded values
    for k in range(size - 1):
        acc[chunk(r - k)] = yield from shift(r + 1 - k, r - k)
    return acc.reshape(x.shape)


def ring_allgather(wire: Wire, block: np.ndarray, sizes: Sequence[int]) -> Schedule[np.ndarray]:
    """Every rank's byte block (``sizes[q]`` bytes from rank ``q``) concatenated in rank order, around a ring."""
    r, size = wire.rank, wire.size
    offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    out = np.empty(int(offsets[-1]), np.uint8)

    def block_of(q: int) -> np.ndarray:
        q %= size
        return out[offsets[q]:offsets[q + 1]]

    block_of(r)[:] = block.reshape(-1).view(np.uint8)
    for k in range(size - 1):
        yield wire.irecv([block_of(r - k - 1)], (r - 1) % size) + wire.isend([block_of(r - k)], (r + 1) % size)
    return out


def allgatherv(wire: Wire, x: np.ndarray, context: str = "") -> Schedule[tuple[np.ndarray, list[int]]]:
    """All ranks' ``x`` concatenated along dimension 0 (row counts may differ), and the counts.

    A ring allgather of 16-byte headers (rows, digest) goes first, so a rank whose dtype, row shape or
    ``context`` differs is the same :class:`ValueError` on every rank, not a hang.
    """
    rows = x.shape[0] if x.ndim else 1
    row_shape = x.shape[1:]
    header = np.array([rows, crc(f"{x.dtype.descr}{row_shape}{context}")], np.int64)
    headers = (yield from ring_allgather(wire, header.view(np.uint8), [header.nbytes] * wire.size)).view(np.int64)
    counts, digests = headers[0::2].tolist(), headers[1::2]
    if np.any(digests != digests[0]):
        raise ValueError(f"hvdsketch: allgatherv: ranks disagree on dtype, row shape or size ({context or x.dtype})")
    row_bytes = x.dtype.itemsize * int(np.prod(row_shape))
    data = yield from ring_allgather(wire, np.ascontiguousarray(x).reshape(-1), [c * row_bytes for c in counts])
    return data.view(x.dtype).reshape((sum(counts),) + row_shape), counts


def alltoallv(wire: Wire, x: np.ndarray, splits: Sequence[int], context: str = "") -> Schedule[np.ndarray]:
    """The rows every rank sent this one, in rank order: ``x`` is cut into ``splits`` (one row count per rank)
    and piece ``q`` goes to rank ``q``, pairwise as in ``MPI_Alltoallv``.

    A header (row count, digest) to every other rank goes first, so bad splits or a dtype, row shape or
    ``context`` mismatch is a :class:`ValueError` on every rank, never a hang.
    """
    r, size = wire.rank, wire.size
    splits = [int(c) for c in splits]
    rows = x.shape[0] if x.ndim else 1
    valid = len(splits) == size and min(splits, default=0) >= 0 and sum(splits) == rows
    row_shape = x.shape[1:]
    mark = crc(f"{x.dtype.descr}{row_shape}{context}") if valid else -1  # the others fail too
    headers = np.array([[c, mark] for c in (splits if valid else [0] * size)], np.int64)
    incoming = np.empty_like(headers)
    incoming[r] = headers[r]
    others = [q for q in range(size) if q != r]
    yield [req for q in others for req in wire.irecv([incoming[q]], q) + wire.isend([headers[q]], q)]
    if not valid:
        raise ValueError(f"hvdsketch: alltoallv needs {size} non-negative splits summing to the {rows} rows "
                         f"sent, got {splits}")
    if np.any(incoming[:, 1] != mark):
        raise ValueError(f"hvdsketch: alltoallv: ranks disagree on dtype or row shape ({context or x.dtype})")
    flat = np.ascontiguousarray(x).reshape((rows,) + row_shape)
    out = np.empty((int(incoming[:, 0].sum()),) + row_shape, x.dtype)
    starts = np.concatenate([[0], np.cumsum(splits)])
    ends = np.concatenate([[0], np.cumsum(incoming[:, 0])])
    out[ends[r]:ends[r + 1]] = flat[starts[r]:starts[r + 1]]
    requests = [req for q in others for req in wire.irecv([out[ends[q]:ends[q + 1]]], q)
                + wire.isend([flat[starts[q]:starts[q + 1]]], q)]
    if requests:
        yield requests
    return out


# --- the communicator ----------------------------------------------------------------------


class MPICommunicator:
    """hvdsketch's collectives on a duplicate of ``comm`` (default ``COMM_WORLD``); constructing it is collective.

    Every rank must start the same collectives in the same order (each call takes the next tag).
    """

    #: Collectives match across ranks by the order of calls, not by name.
    ordered = True
    #: The bitwise OR is a ring allreduce (bytes constant in N), not an allgather.
    ring_bor = True

    def __init__(self, comm: MPI.Intracomm | None = None) -> None:
        self.comm = (comm or MPI.COMM_WORLD).Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.stats = CommStats()
        self._progress = _Progress()
        self._calls = 0

    def launch(self, label: str, schedule: Callable[[Wire], Schedule[T]]) -> Handle[T]:
        """Run ``schedule`` as a non-blocking collective; its bytes are recorded under ``label``."""
        wire = Wire(self.comm, self._calls % 32767 + 1)  # 32767: the smallest MPI_TAG_UB allowed
        self._calls += 1
        return Handle(self._progress, schedule(wire), lambda: self.stats.record(label, wire.sent, wire.received))

    def iallreduce(self, x: np.ndarray, op: str = "sum", wire: str | None = None,
                   label: str | None = None) -> Handle[np.ndarray]:
        """Element-wise ``op`` (``sum``, ``max``, ``bor``) of ``x`` over all ranks; sums may travel
        as ``wire`` = ``float16`` / ``bfloat16`` (e.g. sketch cells), ``None`` keeping ``x.dtype``."""
        if op not in REDUCTIONS:
            raise ValueError(f"hvdsketch: unknown reduction {op!r}; valid: {', '.join(REDUCTIONS)}")
        if op == "bor" and x.dtype != np.uint8:
            raise ValueError(f"hvdsketch: bor reduces uint8 (packed bits), got {x.dtype}")
        if wire is not None and op != "sum":
            raise ValueError(f"hvdsketch: a wire format applies to sums, not {op!r}")
        fmt = wire_format(wire, x.dtype)
        return self.launch(label or f"allreduce.{op}", lambda w: ring_allreduce(w, x, op, fmt))

    def iallgatherv(self, x: np.ndarray, label: str = "allgather") -> Handle[tuple[np.ndarray, list[int]]]:
        """All ranks' ``x`` concatenated along dimension 0, and each rank's row count."""
        return self.launch(label, lambda w: allgatherv(w, x))

    def ialltoallv(self, x: np.ndarray, splits: Sequence[int], label: str = "alltoall") -> Handle[np.ndarray]:
        """The rows every rank sent this one, in rank order (``x`` cut by ``splits``, :func:`alltoallv`)."""
        return self.launch(label, lambda w: alltoallv(w, x, splits))

    def start(self, messages: Sequence[Message], name: str = "") -> Batch[list[Any]]:
        """Start reducing each message by its op, one fused allreduce per (op, dtype) (``name`` only labels).
        Results are of each message's kind: numpy arrays, or tensors on the message tensor's device."""
        for m in messages:
            if m.op not in PROTOCOL_REDUCTIONS and m.op not in GATHERS:
                raise ValueError(f"hvdsketch: unknown reduction op {m.op!r}; valid: average, sum, max, allgather, bor, "
                                 f"alltoall")
        hosted = [_on_host(m.tensor) for m in messages]
        groups: dict[tuple[str, str, str | None], list[int]] = {}
        for i, (m, (array, wire)) in enumerate(zip(messages, hosted)):
            if m.op not in GATHERS:
                groups.setdefault((m.op, array.dtype.str, wire), []).append(i)
        handles, parts = [], []
        for (op, _, wire), picked in groups.items():
            fused = np.concatenate([hosted[i][0].reshape(-1) for i in picked])
            label = "bor" if op == "bor" else f"allreduce.{op}"
            handles.append(self.iallreduce(fused, PROTOCOL_REDUCTIONS[op], wire=wire, label=label))
            parts.append(picked)
        for i, m in enumerate(messages):
            if m.op in GATHERS:
                handles.append(self.iallgatherv(hosted[i][0]) if m.op == "allgather" else
                               self.ialltoallv(hosted[i][0], m.splits or ()))
                parts.append([i])

        def combine(results: list[Any]) -> list[Any]:
            out: list[Any] = [None] * len(messages)
            for picked, result in zip(parts, results):
                if messages[picked[0]].op in GATHERS:
                    gathered = result[0] if messages[picked[0]].op == "allgather" else result
                    out[picked[0]] = _like(gathered, messages[picked[0]].tensor)
                    continue
                sizes = [hosted[i][0].size for i in picked]
                for i, flat in zip(picked, np.split(result, np.cumsum(sizes)[:-1])):
                    summed = self._finish(messages[i], flat.reshape(hosted[i][0].shape))
                    out[i] = _like(summed, messages[i].tensor)
            return out

        return Batch(handles, combine)

    def _finish(self, message: Message, summed: np.ndarray) -> np.ndarray:
        if message.op != "average":
            return summed
        if np.issubdtype(summed.dtype, np.floating):
            return summed / summed.dtype.type(self.size)
        return summed // self.size  # integers average with floor division

    def free(self) -> None:
        """Release the duplicated communicator (collective)."""
        self.comm.Free()


def _on_host(tensor: Any) -> tuple[np.ndarray, str | None]:
    """A message tensor as a C-contiguous numpy array (a host tensor's view, an accelerator's host copy) and its
    wire format (bfloat16, which numpy lacks, as float32 that travels as bfloat16)."""
    if isinstance(tensor, np.ndarray):
        return np.ascontiguousarray(tensor), None
    ops = backend(tensor)
    if ops.dtype_name(tensor) == "bfloat16":
        return np.ascontiguousarray(ops.to_numpy(ops.cast(tensor, "float32"))), "bfloat16"
    return np.ascontiguousarray(ops.to_numpy(tensor)), None


def _like(result: np.ndarray, message: Any) -> Any:
    """A result as the message's kind: the array itself, or a tensor sharing its memory on the host
    (copied to an accelerator), in the message's dtype."""
    if isinstance(message, np.ndarray):
        return result
    ops = backend(message)
    out = ops.adopt(result, message)
    return ops.cast(out, "bfloat16") if ops.dtype_name(message) == "bfloat16" else out
