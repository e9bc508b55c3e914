"""Exact sparse exchange near its lower bound: a sparse reduce-scatter to row owners, then their sums.

Each rank must send at least ``z + (N - 2) u / N`` rows (``z`` the mean rows a rank touched, ``u`` the rows of
the union ``U``; DESIGN.md, "Exact sparse exchange and its lower bound"). This method meets it, plus round one's
index, in three rounds::

    1. allgather   each rank's rows, coded (:mod:`.rowcode`: bitmap or deltas)
       -> every rank knows who touched which row, and so, alike everywhere, each
          row's owner: one of the ranks that touched it, the first from rank
          (position of the row in U) mod N on, cyclically
    2. alltoall    each rank's rows to their owners (its own stay home), split by owner
       -> each owner sums the rows it owns
    3. allgather   each owner's sums; every rank knows their order, so no index travels

``wire=float16`` rounds the rows of round two and the sums of round three; what the first rounding took from this
rank's rows is its residual.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

from hvdsketch.compress import rowcode, sizing
from hvdsketch.compress.allgather import lossy_residual
from hvdsketch.compress.base import Compressor, Exchange, Message, Round, TensorContext
from hvdsketch.compress.support import Layout, RowSparse, from_units, units_of
from hvdsketch.ops import backend
from hvdsketch.ops.contract import Ops


@dataclass(frozen=True)
class Owners:
    """Who owns which union row, as every rank computes it from every rank's rows.

    ``union``: sorted int64 units; ``owner``: each union unit's owning rank; ``pair_rank`` / ``pair_pos``: every
    (rank, unit) touch in rank order, then unit order, the unit as its union position.
    """

    union: Any
    owner: Any
    pair_rank: Any
    pair_pos: Any

    @classmethod
    def agree(cls, ops: Ops, rows: Sequence[Any], units: int) -> "Owners":
        """The owners from each rank's sorted ``rows`` (int64), alike on every rank."""
        size = len(rows)
        pair_row = ops.concat(list(rows))
        pair_rank = ops.concat([ops.zeros(ops.shape(r)[0], "int64", r) + q for q, r in enumerate(rows)])
        union = ops.positive(ops.indicator(units, pair_row, "uint8"))
        count = ops.shape(union)[0]
        position = ops.scatter(units, union, ops.arange(count, like=union))
        pair_pos = ops.gather(position, pair_row)
        if count == 0:
            return cls(union, union, pair_rank, pair_pos)
        # each touch's distance, cyclically, from its row's starting rank; the smallest per row wins
        order = ops.sort0(pair_pos * size + (pair_rank - pair_pos % size + size) % size)
        segment = order // size
        first = ops.positive(ops.concat([ops.zeros(1, "int64", order) + 1,
                                         ops.cast(segment[1:] != segment[:-1], "int64")]))
        owner = (ops.gather(order, first) % size + ops.arange(count, like=union) % size) % size
        return cls(union, owner, pair_rank, pair_pos)

    @property
    def count(self) -> int:
        return backend(self.union).shape(self.union)[0]

    def owned(self, ops: Ops, rank: int) -> Any:
        """Union positions ``rank`` owns, sorted (a host sync: the count)."""
        return ops.positive(ops.cast(self.owner == rank, "int64"))

    def owned_pairs(self, ops: Ops, rank: int) -> Any:
        """The touches of rows ``rank`` owns, in touch order (what round two brings it; a host sync)."""
        return ops.positive(ops.cast(ops.gather(self.owner, self.pair_pos) == rank, "int64"))

    def gathered_order(self, ops: Ops) -> Any:
        """For each union position, its row in round three's gather (by owner, then union order)."""
        count = self.count
        arrival = ops.sort0(self.owner * count + ops.arange(count, like=self.owner)) % count
        return ops.scatter(count, arrival, ops.arange(count, like=arrival))


@dataclass(frozen=True)
class Balanced(Compressor):
    """Each row summed by one of the ranks that touched it, the sums gathered: exact, near the bound.

    Options (flag ``balanced:key=value,...``):
      wire     rows and sums travel as float16, bfloat16 or float32 (default: the tensor's dtype, exact)
      block    elements per unit for vectors (default 256)
    """

    name: ClassVar[str] = "balanced"
    row_sparse: ClassVar[bool] = True
    host_sized: ClassVar[bool] = True

    wire: str | None = None
    block: int = 256

    def __post_init__(self) -> None:
        sizing.check_wire(self.wire)
        if self.block < 1:
            raise ValueError("block must be >= 1")

    def exchange(self, tensor: Any, ctx: TensorContext) -> Exchange:
        layout = Layout.of(ctx.shape, self.block)
        messages, (units, values) = self.compress(tensor, ctx)
        ops, dtype = backend(values), backend(values).dtype_name(values)
        if ops.is_symbolic(values):
            raise ValueError("hvdsketch: balanced sizes its rounds on the host from the ranks' rows; it cannot "
                             "be traced into a graph (hvdsketch's tape runs it in Python ops inside tf.function)")
        rows_of = self.decompress((yield Round(messages)), None, ctx)
        # all ranks, or this one alone (rank 0 of 1) where an exchange runs over this rank by itself
        world, rank = (len(rows_of), ctx.rank) if len(rows_of) == ctx.world_size else (1, 0)
        owners = Owners.agree(ops, rows_of, layout.units)
        if owners.count == 0:  # no rank holds a non-zero: nothing more to send, alike on every rank
            return from_units(ops, layout, owners.union, ops.zeros((0, layout.unit_len), dtype, values),
                              ctx.shape, isinstance(tensor, RowSparse), ctx.out, tensor), ctx.state
        # round two: this rank's rows to their owners, by owner, each owner's in unit order
        mine = ops.gather(owners.owner, ops.gather(ops.scatter(layout.units, owners.union,
                                                               ops.arange(owners.count, like=units)), units))
        rows = ops.shape(units)[0]
        sending = ops.sort0(mine * rows + ops.arange(rows, like=units)) % max(rows, 1)
        splits = [int(c) * layout.unit_len for c in ops.to_numpy(
            ops.scatter_add(world, mine, ops.zeros(rows, "int64", units) + 1))]
        sent = ops.cast(ops.flatten(ops.gather(values, sending)), self.wire or dtype)
        residual = (lambda: None) if (self.wire or dtype) == dtype else (
            lambda: lossy_residual(ops, layout, ops.gather(units, sending),
                                   ops.gather(values, sending), ops.reshape(sent, (-1, layout.unit_len)), ctx.shape))
        (received,) = yield Round([Message(sent, "alltoall", tuple(splits))], residual)
        # what arrived: every touch of an owned row, in rank order, each rank's in unit order
        owned = owners.owned(ops, rank)
        local = ops.scatter(owners.count, owned, ops.arange(ops.shape(owned)[0], like=owned))
        arriving = ops.gather(local, ops.gather(owners.pair_pos, owners.owned_pairs(ops, rank)))
        sums = ops.add_rows(ops.zeros((ops.shape(owned)[0], layout.unit_len), dtype, values), arriving,
                            ops.reshape(ops.cast(received, dtype), (-1, layout.unit_len)))
        (gathered,) = yield Round([Message(ops.flatten(ops.cast(sums, self.wire or dtype)), "allgather")])
        rows_of_union = ops.gather(ops.reshape(ops.cast(gathered, dtype), (-1, layout.unit_len)),
                                   owners.gathered_order(ops))
        return from_units(ops, layout, owners.union, rows_of_union / world, ctx.shape,
                          isinstance(tensor, RowSparse), ctx.out, tensor), ctx.state

    def compress(self, tensor: Any, ctx: TensorContext) -> tuple[list[Message], tuple[Any, Any]]:
        """Round one: the header and code of this rank's non-zero units; it keeps the units and their values."""
        layout = Layout.of(ctx.shape, self.block)
        ops, units, values = units_of(tensor, layout)
        header, code = rowcode.encode(ops, units, layout.units)
        return ([Message(ops.constant(header, "int64", like=units), "allgather"), Message(code, "allgather")],
                (units, values))

    def decompress(self, reduced: Sequence[Any], local: Any, ctx: TensorContext) -> list[Any]:
        """Every rank's sorted units, in rank order, from round one's gathered headers and codes."""
        ops, units = backend(reduced[1]), Layout.of(ctx.shape, self.block).units
        headers = ops.to_numpy(reduced[0]).reshape(-1, 2).tolist()
        codes = ops.split(reduced[1], [rowcode.size(kind, count, units) for kind, count in headers])
        return [rowcode.decode(ops, kind, count, code, units) for (kind, count), code in zip(headers, codes)]
