"""Sparse collectives on :class:`~hvdsketch.collectives.mpi.MPICommunicator`.

A compressed gradient is a :class:`SparseVector` or a dense array whose non-zeros cluster in blocks. Each
function starts a non-blocking collective and returns its handle; all record the exact bytes on the wire.

- :func:`ibitmap_or`: OR-allreduce of a packed bitmap (the sketch's union support, 1 bit per unit);
- :func:`isparse_allgather`: every rank's ``(int64 index, value)`` pairs, per-rank counts, no padding;
- :func:`isparcml_allreduce`: SparCML's sparse recursive doubling (Renggli et al., SC 2019);
- :func:`iblock_allreduce`: OmniReduce's block-sparse allreduce (Fei et al., SIGCOMM 2021).

A sketch's cells need none: ``communicator.iallreduce(cells, wire="float16" | "bfloat16", label="sketch")``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import numpy as np

from hvdsketch.collectives.mpi import Handle, MPICommunicator, Schedule, Wire, allgatherv, ring_allreduce
from hvdsketch.digests import crc

INDEX = np.dtype(np.int64)


@dataclass(frozen=True)
class SparseVector:
    """A vector of ``size`` elements given by its support: strictly increasing int64 ``indices``
    and their ``values`` (a value may be zero, e.g. where two ranks' values cancelled)."""

    indices: np.ndarray
    values: np.ndarray
    size: int

    def __post_init__(self) -> None:
        idx, vals = self.indices, self.values
        if idx.dtype != INDEX or idx.ndim != 1 or vals.ndim != 1 or len(idx) != len(vals):
            raise ValueError("hvdsketch: SparseVector needs 1-D int64 indices and 1-D values of equal length")
        if len(idx) and (idx[0] < 0 or idx[-1] >= self.size or np.any(np.diff(idx) <= 0)):
            raise ValueError(f"hvdsketch: SparseVector indices must be strictly increasing in [0, {self.size})")

    @classmethod
    def from_dense(cls, x: np.ndarray) -> "SparseVector":
        flat = x.reshape(-1)
        idx = np.flatnonzero(flat).astype(INDEX)
        return cls(idx, flat[idx], flat.size)

    def to_dense(self) -> np.ndarray:
        out = np.zeros(self.size, self.values.dtype)
        out[self.indices] = self.values
        return out

    @property
    def nbytes(self) -> int:
        return self.indices.nbytes + self.values.nbytes


#: The result of a sparse allreduce: sparse while it stayed sparse, else dense.
Reduced = Union[SparseVector, np.ndarray]


def densify(x: Reduced) -> np.ndarray:
    return x.to_dense() if isinstance(x, SparseVector) else x


# --- bitmap OR -----------------------------------------------------------------------------


def bitmap_or(wire: Wire, bits: np.ndarray) -> Schedule[np.ndarray]:
    """OR of a boolean vector over all ranks, 8 flags per byte on the wire."""
    union = yield from ring_allreduce(wire, np.packbits(bits.astype(bool)), "bor")
    return np.unpackbits(union, count=len(bits)).astype(bool)


def ibitmap_or(comm: MPICommunicator, bits: np.ndarray) -> Handle[np.ndarray]:
    """Start the OR-allreduce of a 1-D boolean vector (e.g. a support bitmap)."""
    if bits.ndim != 1:
        raise ValueError(f"hvdsketch: bitmap must be 1-D, got shape {bits.shape}")
    return comm.launch("bitmap", lambda wire: bitmap_or(wire, bits))


# --- sparse allgather ----------------------------------------------------------------------


def _pairs(x: SparseVector) -> np.ndarray:
    """``x`` as packed ``(index, value)`` records, the unit the allgather moves."""
    pairs = np.empty(len(x.indices), np.dtype([("index", INDEX), ("value", x.values.dtype)]))
    pairs["index"], pairs["value"] = x.indices, x.values
    return pairs


def isparse_allgather(comm: MPICommunicator, x: SparseVector) -> Handle[list[SparseVector]]:
    """Start gathering every rank's sparse vector (rank order); ranks must agree on size and dtype."""

    def schedule(wire: Wire) -> Schedule[list[SparseVector]]:
        pairs, counts = yield from allgatherv(wire, _pairs(x), context=f"size={x.size}")
        return [SparseVector(np.ascontiguousarray(p["index"]), np.ascontiguousarray(p["value"]), x.size)
                for p in np.split(pairs, np.cumsum(counts)[:-1])]

    return comm.launch("sparse_allgather", schedule)


# --- SparCML recursive doubling ------------------------------------------------------------


def _settle(x: Reduced, dense_at: float) -> Reduced:
    """``x`` dense once its sparse form takes ``dense_at`` times the dense form's bytes or more."""
    if isinstance(x, SparseVector) and x.nbytes >= dense_at * x.size * x.values.itemsize:
        return x.to_dense()
    return x


def _merge(a: Reduced, b: Reduced, dense_at: float) -> Reduced:
    """``a + b``: sparse on the union support if both are sparse, else dense; symmetric bit for bit."""
    if isinstance(a, SparseVector) and isinstance(b, SparseVector):
        both = np.concatenate([a.indices, b.indices])
        order = np.argsort(both, kind="stable")  # timsort: a linear merge of the two sorted runs
        merged = both[order]
        starts = np.flatnonzero(np.diff(merged, prepend=-1))  # first of each distinct index
        values = np.add.reduceat(np.concatenate([a.values, b.values])[order], starts)
        return _settle(SparseVector(merged[starts], values, a.size), dense_at)
    if isinstance(a, SparseVector):
        a, b = b, a
    out = np.array(a, copy=True)
    if isinstance(b, SparseVector):
        out[b.indices] += b.values
    else:
        out += b
    return out


def _header(x: Reduced, dtype_id: int) -> np.ndarray:
    """What precedes a partial sum: its non-zero count (-1: dense), its size and a digest of its dtype."""
    if isinstance(x, SparseVector):
        return np.array([len(x.indices), x.size, dtype_id], np.int64)
    return np.array([-1, x.size, dtype_id], np.int64)


def _parts(x: Reduced) -> list[np.ndarray]:
    return [x.indices, x.values] if isinstance(x, SparseVector) else [x]


def _post(wire: Wire, x: Reduced, dtype_id: int, peer: int) -> list:
    """Send ``x`` with its header to ``peer``; the header lets it size its receive buffers."""
    return wire.isend([_header(x, dtype_id), *_parts(x)], peer)


def _take(wire: Wire, peer: int, like: SparseVector, dtype_id: int, pending: list) -> Schedule[Reduced]:
    """Receive a partial sum from ``peer``, completing ``pending`` sends with the payload's receive, not the
    header's (a large send completes only once the peer, having read this rank's header, posts its receive)."""
    header = np.empty(3, np.int64)
    yield wire.irecv([header], peer)
    count, size, theirs = header.tolist()
    if size != like.size or theirs != dtype_id:
        raise ValueError(f"hvdsketch: sparse allreduce: rank {peer} sends a vector of size {size} "
                         f"or another dtype; this rank has size {like.size}, dtype {like.values.dtype}")
    if count < 0:
        dense = np.empty(size, like.values.dtype)
        yield wire.irecv([dense], peer) + pending
        return dense
    indices, values = np.empty(count, INDEX), np.empty(count, like.values.dtype)
    yield wire.irecv([indices, values], peer) + pending
    return SparseVector(indices, values, size)


def recursive_doubling(wire: Wire, x: SparseVector, dense_at: float) -> Schedule[Reduced]:
    """SparCML's sparse allreduce for any rank count: with ``p`` the largest power of two <= N, ranks ``r >= p``
    hand their vector to ``r - p`` and get the result back; the first ``p`` run ``log2 p`` rounds of
    swap-and-merge with partner ``r XOR 2^k``, each message sparse or dense after a 24-byte header."""
    r, p = wire.rank, 1 << (wire.size.bit_length() - 1)
    dtype_id = crc(x.values.dtype.str)
    state = _settle(x, dense_at)
    if r >= p:
        return (yield from _take(wire, r - p, x, dtype_id, _post(wire, state, dtype_id, r - p)))
    if r + p < wire.size:
        state = _merge(state, (yield from _take(wire, r + p, x, dtype_id, [])), dense_at)
    mask = 1
    while mask < p:
        theirs = yield from _take(wire, r ^ mask, x, dtype_id, _post(wire, state, dtype_id, r ^ mask))
        state = _merge(state, theirs, dense_at)
        mask <<= 1
    if r + p < wire.size:
        yield _post(wire, state, dtype_id, r + p)
    return state


def isparcml_allreduce(comm: MPICommunicator, x: SparseVector, dense_at: float = 1.0) -> Handle[Reduced]:
    """Start the sum of every rank's sparse vector by SparCML recursive doubling; a partial sum goes dense for
    good once its sparse form takes ``dense_at`` times the dense bytes. The result is a :class:`SparseVector`
    if it stayed sparse, else a dense array (:func:`densify` either)."""
    if not dense_at > 0:
        raise ValueError(f"hvdsketch: dense_at must be > 0, got {dense_at}")
    return comm.launch("sparcml", lambda wire: recursive_doubling(wire, x, dense_at))


# --- OmniReduce block-sparse ---------------------------------------------------------------


def _block_rows(flat: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """``flat`` as a view of whole blocks, one per row, and the short last block (maybe empty)."""
    whole = flat.size // block
    return flat[:whole * block].reshape(whole, block), flat[whole * block:]


def block_sparse(wire: Wire, x: np.ndarray, block: int) -> Schedule[np.ndarray]:
    """OmniReduce: OR the bitmaps of non-zero blocks, then sum-allreduce the union's blocks only."""
    flat = np.ascontiguousarray(x).reshape(-1)
    present = np.zeros(-(-flat.size // block), bool)
    present[np.flatnonzero(flat) // block] = True
    union = np.flatnonzero((yield from bitmap_or(wire, present)))
    if len(union) == len(present):  # every block is non-zero somewhere: plain dense allreduce
        return (yield from ring_allreduce(wire, x, "sum"))
    rows, tail = _block_rows(flat, block)
    whole = union[union < len(rows)]
    with_tail = len(whole) < len(union)
    moved = [rows[whole].reshape(-1)] + ([tail] if with_tail else [])
    summed = yield from ring_allreduce(wire, np.concatenate(moved), "sum")
    out = np.zeros_like(flat)
    out_rows, out_tail = _block_rows(out, block)
    out_rows[whole] = summed[:len(whole) * block].reshape(-1, block)
    if with_tail:
        out_tail[:] = summed[len(whole) * block:]
    return out.reshape(x.shape)


def iblock_allreduce(comm: MPICommunicator, x: np.ndarray, block: int = 256) -> Handle[np.ndarray]:
    """Start the sum of every rank's ``x`` (any shape) moving only blocks of ``block`` flat
    elements that are non-zero on some rank (for a row-sparse matrix: ``block`` = row length)."""
    if block < 1:
        raise ValueError(f"hvdsketch: block must be >= 1, got {block}")
    return comm.launch("omnireduce", lambda wire: block_sparse(wire, x, block))
