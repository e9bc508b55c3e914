"""Residual stores: how one tensor's error-feedback residual is kept between steps.

Error feedback (Seide et al., 2014; Karimireddy et al., 2019) sends ``C(g + e_t)`` and keeps
``e_{t+1} = g + e_t - C(g + e_t)``; a store keeps a compressed ``Q(e)`` instead (ConEF, Li et al., 2023).
A store is a frozen dataclass whose fields are its flag's options (``topk:ratio=0.1``); its state is a
dict of back-end tensors on the residual's device, computed there with no host sync. Each step a
:class:`~hvdsketch.memory.residual.Memory` calls::

    residual, held = store.take(ops, state, name, like)  # before compression: g' = g + residual
    state = store.put(ops, held, g' - estimate, name)     # after: fold in what was not sent

``held`` is what :meth:`Store.take` did not give back (``None`` but for ``sketch`` and ``shared``).
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import numpy as np

from hvdsketch.compress.support import RowSparse, values_of
from hvdsketch.digests import digest
from hvdsketch.spec import render
from hvdsketch.ops import backend
from hvdsketch.ops.contract import Ops

State = dict[str, Any]

#: Bytes per element of the storage dtypes.
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8}


def numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


class Store(ABC):
    """Base of all residual stores; subclasses are frozen dataclasses whose fields are the options."""

    #: The name used in the ``--memory`` flag.
    name: ClassVar[str]
    #: False for ``none``: no residual is kept, so the memory skips the arithmetic too.
    keeps: ClassVar[bool] = True
    #: True when the state lives in host memory rather than on the tensor's device.
    host: ClassVar[bool] = False
    #: State keys holding 0-d bookkeeping tensors (not counted as residual bytes).
    scalars: ClassVar[tuple[str, ...]] = ()
    #: True when :meth:`put` keeps a :class:`RowSparse` residual as rows (other stores get dense residuals).
    row_sparse: ClassVar[bool] = False
    #: True when a dense residual's state has fixed shapes on its device, so a traced graph can hold it.
    traceable: ClassVar[bool] = False

    def slot(self, name: str, shape: tuple[int, ...]) -> str:
        """The key the state is kept under; tensors with equal slots share one state."""
        return name

    @abstractmethod
    def take(self, ops: Ops, state: State, name: str, like: Any) -> tuple[Any | None, State | None]:
        """The residual to add to ``like`` (same shape and dtype, or ``None``) and the state left behind."""

    @abstractmethod
    def put(self, ops: Ops, held: State | None, residual: Any, name: str) -> State:
        """The state after folding this step's ``residual`` into what :meth:`take` left behind."""

    @abstractmethod
    def nbytes(self, shape: Sequence[int]) -> int:
        """Bytes of the state for one tensor of ``shape`` (a ``shared`` buffer counts once per shape)."""

    def export(self, key: str, value: Any) -> np.ndarray:
        """One state entry as a plain numpy array (bfloat16, which numpy lacks, as float32)."""
        ops = backend(value)
        if ops.dtype_name(value) == "bfloat16":
            value = ops.cast(value, "float32")
        return ops.to_numpy(value)

    def restore(self, ops: Ops, key: str, array: np.ndarray, like: Any) -> Any:
        """Inverse of :meth:`export`, on ``like``'s back-end and device."""
        return ops.from_numpy(array, like)

    def __str__(self) -> str:
        return render(self)


@dataclass(frozen=True)
class Nothing(Store):
    """No error feedback: whatever compression drops is lost."""

    name: ClassVar[str] = "none"
    keeps: ClassVar[bool] = False

    def take(self, ops: Ops, state: State, name: str, like: Any) -> tuple[None, None]:
        return None, None

    def put(self, ops: Ops, held: State | None, residual: Any, name: str) -> State:
        return {}

    def nbytes(self, shape: Sequence[int]) -> int:
        return 0


@dataclass(frozen=True)
class Fp32(Store):
    """The full residual in float32 (classic error feedback); a row-sparse one kept as rows (``i``, ``v``)."""

    name: ClassVar[str] = "fp32"
    row_sparse: ClassVar[bool] = True
    traceable: ClassVar[bool] = True

    def take(self, ops: Ops, state: State, name: str, like: Any) -> tuple[Any, None]:
        dtype = ops.dtype_name(values_of(like))
        if "i" in state:
            shape = like.dense_shape if isinstance(like, RowSparse) else ops.shape(like)
            return RowSparse(state["i"], ops.cast(state["v"], dtype), tuple(shape)), None
        return ops.cast(state["e"], dtype), None

    def put(self, ops: Ops, held: State | None, residual: Any, name: str) -> State:
        if isinstance(residual, RowSparse):  # its rows, but those left exactly zero
            indices, values = ops.cast(residual.indices, "int64"), residual.values
            rows = ops.reshape(values, (-1, numel(residual.dense_shape[1:])))
            kept = ops.nonzero_rows(rows)
            if ops.shape(kept)[0] < ops.shape(rows)[0]:
                indices = ops.gather(indices, kept)
                values = ops.reshape(ops.gather(rows, kept), (-1, *residual.dense_shape[1:]))
            return {"i": indices, "v": ops.cast(values, "float32")}
        return {"e": ops.cast(residual, "float32")}

    def nbytes(self, shape: Sequence[int]) -> int:
        return 4 * numel(shape)


@dataclass(frozen=True)
class Fp16(Store):
    """The residual in float16, scaled by a power of two so it neither overflows nor underflows.

    The scale ``s = 2^(ceil(log2 ||e||) - 15)`` is a 0-d float32 tensor on the device (1 for a zero or
    non-finite norm); per entry ``|err_i| <= 2^-11 |e_i| + 2^-39 ||e||`` for ``2^-85 <= ||e|| <= 2^115``.
    """

    name: ClassVar[str] = "fp16"
    dtype: ClassVar[str] = "float16"
    scalars: ClassVar[tuple[str, ...]] = ("scale",)

    def take(self, ops: Ops, state: State, name: str, like: Any) -> tuple[Any, None]:
        return ops.cast(ops.cast(state["e"], "float32") * state["scale"], ops.dtype_name(like)), None

    def put(self, ops: Ops, held: State | None, residual: Any, name: str) -> State:
        log_norm = ops.log2(ops.sqnorm(residual) ** 0.5)
        exponent = ops.clip(-ops.floor(-log_norm) - 15, -100, 100)  # 1/scale stays a finite float32
        scale = ops.cast(2.0 ** ops.where(ops.all_finite_flag(log_norm), exponent, 0.0), "float32")
        return {"e": ops.cast(ops.cast(residual, "float32") * (1.0 / scale), self.dtype), "scale": scale}

    def nbytes(self, shape: Sequence[int]) -> int:
        return ITEMSIZE[self.dtype] * numel(shape)

    def restore(self, ops: Ops, key: str, array: np.ndarray, like: Any) -> Any:
        return ops.cast(super().restore(ops, key, array, like), "float32" if key in self.scalars else self.dtype)


@dataclass(frozen=True)
class Bf16(Fp16):
    """The residual in bfloat16: float32's range, 8 significant bits, ``|err_i| <= 2^-8 |e_i|``."""

    name: ClassVar[str] = "bf16"
    dtype: ClassVar[str] = "bfloat16"


@dataclass(frozen=True)
class TopK(Store):
    """The ``k = ceil(ratio * n)`` entries of the residual largest in magnitude, as (index, value).

    It loses the ``n - k`` smallest squares, the least any ``k``-entry store can; 12 bytes per kept entry.
    A row-sparse residual keeps its ``k / row length`` rows of largest norm, as rows (``ri``, ``rv``).
    """

    name: ClassVar[str] = "topk"
    row_sparse: ClassVar[bool] = True
    ratio: float = 0.1

    def __post_init__(self) -> None:
        if not 0 < self.ratio <= 1:
            raise ValueError("ratio must be in (0, 1]")

    def k(self, n: int) -> int:
        return min(n, max(1, math.ceil(self.ratio * n)))

    def take(self, ops: Ops, state: State, name: str, like: Any) -> tuple[Any, None]:
        dtype = ops.dtype_name(values_of(like))
        shape = tuple(like.dense_shape) if isinstance(like, RowSparse) else ops.shape(like)
        if "ri" in state:
            return RowSparse(state["ri"], ops.cast(state["rv"], dtype), shape), None
        dense = ops.scatter(numel(shape), state["i"], state["v"])
        return ops.reshape(ops.cast(dense, dtype), shape), None

    def put(self, ops: Ops, held: State | None, residual: Any, name: str) -> State:
        if isinstance(residual, RowSparse):
            row_len = numel(residual.dense_shape[1:])
            rows = ops.reshape(residual.values, (-1, row_len))
            kept = ops.topk_abs(ops.reduce_sum(rows * rows, axis=1), -(-self.k(numel(residual.dense_shape)) // row_len))
            return {"ri": ops.gather(ops.cast(residual.indices, "int64"), kept),
                    "rv": ops.cast(ops.reshape(ops.gather(rows, kept), (-1, *residual.dense_shape[1:])), "float32")}
        flat = ops.flatten(residual)
        index = ops.topk_abs(flat, self.k(numel(ops.shape(residual))))
        return {"i": index, "v": ops.cast(ops.gather(flat, index), "float32")}

    def nbytes(self, shape: Sequence[int]) -> int:
        return (ITEMSIZE["int64"] + ITEMSIZE["float32"]) * self.k(numel(shape))


@dataclass(frozen=True)
class Shared(Fp32):
    """Tensors of one shape share one float32 buffer; the largest residual keeps it.

    The buffer holds its owner (:meth:`owner` of the tensor's name) and energy ``||e||^2``. Only the owner
    takes it back, emptying it (energy -1; other members get zeros); a new residual replaces it when it is
    empty or the new one has at least as much energy. Both choices are made on the device.
    """

    name: ClassVar[str] = "shared"
    scalars: ClassVar[tuple[str, ...]] = ("owner", "energy")
    row_sparse: ClassVar[bool] = False
    traceable: ClassVar[bool] = False

    def slot(self, name: str, shape: tuple[int, ...]) -> str:
        return f"shared{tuple(shape)}"

    @staticmethod
    def owner(name: str) -> int:
        """The id the buffer holds for tensor ``name`` (equal on every rank and across runs)."""
        return digest(name, bits=62)

    def take(self, ops: Ops, state: State, name: str, like: Any) -> tuple[Any, State]:
        mine = state["owner"] == self.owner(name)
        residual = ops.cast(ops.where(mine, state["e"], 0.0), ops.dtype_name(like))
        return residual, {**state, "energy": ops.where(mine, -1.0, state["energy"])}

    def put(self, ops: Ops, held: State | None, residual: Any, name: str) -> State:
        energy, e = ops.sqnorm(residual), ops.cast(residual, "float32")
        if held is None:
            return {"e": e, "owner": ops.zeros((), "int64", residual) + self.owner(name), "energy": energy}
        replace = ~(energy < held["energy"])
        return {"e": ops.where(replace, e, held["e"]), "owner": ops.where(replace, self.owner(name), held["owner"]),
                "energy": ops.where(replace, energy, held["energy"])}


@dataclass(frozen=True)
class Offload(Fp32):
    """The float32 residual in host memory: exact, no accelerator memory, but two synchronous host copies
    per tensor and step (timed in the memory's ``seconds["offload"]``); saves nothing on a CPU-only machine."""

    name: ClassVar[str] = "offload"
    host: ClassVar[bool] = True
    row_sparse: ClassVar[bool] = False
    traceable: ClassVar[bool] = False

    def take(self, ops: Ops, state: State, name: str, like: Any) -> tuple[Any, None]:
        return ops.cast(ops.to_device(state["e"], like), ops.dtype_name(like)), None

    def put(self, ops: Ops, held: State | None, residual: Any, name: str) -> State:
        return {"e": ops.to_host(ops.cast(residual, "float32"))}

    def restore(self, ops: Ops, key: str, array: np.ndarray, like: Any) -> Any:
        return ops.to_host(ops.from_numpy(array, like))
