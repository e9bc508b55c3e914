"""A residual memory: each tensor's error-feedback state, kept by the store its name maps to.

:class:`Memory` is what the exchanger (:mod:`hvdsketch.exchange`) calls around every compressor:
``compensate`` before compression, ``update`` after; the stores are :mod:`hvdsketch.memory.stores`.
:meth:`Memory.state_dict` gives nested dicts of numpy arrays and strings, free of framework and device::

    {"spec": "fp16", "default": "fp16", "stores": {name: store, ...},
     "slots": {slot: {"store": "fp16", key: np.ndarray, ...}, ...}}

:meth:`Memory.load_state_dict` takes it back (arrays become tensors at each slot's first use), and the
memory continues bit for bit.
"""
from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from typing import Any, Mapping

import numpy as np

from hvdsketch.compress.state import holding, holds, written
from hvdsketch.compress.support import RowSparse, values_of
from hvdsketch.memory.registry import create_store
from hvdsketch.memory.stores import Fp32, State, Store
from hvdsketch.ops import backend
from hvdsketch.ops.contract import Ops


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A :class:`Memory`'s slots at one moment (:meth:`Memory.snapshot`)."""

    state: dict[str, State]
    slot_store: dict[str, Store]
    loaded: dict[str, Mapping[str, np.ndarray]]


class Memory:
    """Error-feedback residuals of many tensors.

    Args:
        stores: the store for each tensor name (a plan); names not in it use ``default``.
        default: the store of every other tensor.
        spec: the flag this memory was made from (for messages and agreement checks).
    """

    def __init__(self, stores: Mapping[str, Store] | None = None, default: Store = Fp32(),
                 spec: str | None = None) -> None:
        self.stores: dict[str, Store] = dict(stores or {})
        self.default = default
        self.spec = spec or str(default)
        #: Host seconds inside each store kind (take and put); on an accelerator, not waited for (no sync).
        self.seconds: dict[str, float] = defaultdict(float)
        self._state: dict[str, State] = {}
        self._slot_store: dict[str, Store] = {}
        self._loaded: dict[str, Mapping[str, np.ndarray]] = {}

    def store(self, name: str) -> Store:
        return self.stores.get(name, self.default)

    # -- the ResidualMemory protocol ---------------------------------------

    def compensate(self, name: str, tensor: Any) -> Any:
        """``g + e``: the tensor (dense, or :class:`RowSparse`) plus what its store gives back of the
        residual; row-sparse when both are (the rows of both, a row given twice summed later)."""
        store = self.store(name)
        if not store.keeps:
            return tensor
        if isinstance(tensor, RowSparse) and not (store.row_sparse and not _traced(tensor)):
            tensor = tensor.to_dense()
        ops = backend(values_of(tensor))
        slot = store.slot(name, _shape(ops, tensor))
        state = self._get(ops, name, slot, store, values_of(tensor))
        if state is None:
            return tensor
        start = time.perf_counter()
        residual, held = store.take(ops, state, name, tensor)
        self.seconds[store.name] += time.perf_counter() - start
        self._set(ops, slot, store, held)
        return tensor if residual is None else add(tensor, residual)

    def keeps(self, name: str) -> bool:
        """Whether ``name``'s residual is kept at all (so the exchanger can skip computing it)."""
        return self.store(name).keeps

    def takes_rows(self, name: str) -> bool:
        """Whether ``name``'s store keeps a :class:`RowSparse` residual as rows."""
        return self.store(name).row_sparse

    def update(self, name: str, residual: Any) -> None:
        """Keep ``residual`` (dense, or :class:`RowSparse`): what this rank's messages did not carry."""
        store = self.store(name)
        if store.keeps:
            if isinstance(residual, RowSparse) and not (store.row_sparse and not _traced(residual)):
                residual = residual.to_dense()  # (a traced graph holds a residual of one shape: dense)
            self.put(backend(values_of(residual)), name, store, residual)

    def put(self, ops: Ops, name: str, store: Store, residual: Any) -> None:
        """Fold ``residual`` into ``name``'s state as ``store`` keeps it."""
        slot = store.slot(name, _shape(ops, residual))
        held = self._get(ops, name, slot, store, values_of(residual))
        start = time.perf_counter()
        state = store.put(ops, held, residual, name)
        self.seconds[store.name] += time.perf_counter() - start
        self._set(ops, slot, store, state)

    def snapshot(self) -> "Snapshot":
        """What the memory holds now, to :meth:`restore` after a step that must leave no trace; no copy, as
        ``put`` never writes into kept tensors (so a traced graph's held state is not covered)."""
        return Snapshot(dict(self._state), dict(self._slot_store), dict(self._loaded))

    def restore(self, snapshot: "Snapshot", only: Mapping[str, tuple[int, ...]] | None = None) -> None:
        """Put back what :meth:`snapshot` took: every slot, or those of the tensors ``only`` maps to shapes."""
        slots = None if only is None else {self.store(name).slot(name, tuple(shape)) for name, shape in only.items()}
        for kept, now in ((snapshot.state, self._state), (snapshot.slot_store, self._slot_store),
                          (snapshot.loaded, self._loaded)):
            for slot in (set(kept) | set(now)) if slots is None else slots:
                if slot in kept:
                    now[slot] = kept[slot]
                else:
                    now.pop(slot, None)

    def traceable(self) -> bool:
        """Whether every store's state has fixed shapes on the device, so a traced graph can hold it."""
        return all(store.traceable for store in (self.default, *self.stores.values()))

    # -- state --------------------------------------------------------------

    def _get(self, ops: Ops, name: str, slot: str, store: Store, like: Any) -> State | None:
        traced = ops.is_symbolic(like)
        if slot in self._loaded:
            with ops.outside_trace():  # (a graph being traced holds it: made eagerly)
                restored = self._restored(ops, slot, store, self._loaded.pop(slot), like)
            self._set(ops, slot, store, restored)
        state = self._state.get(slot)
        if traced and not holds((state or {}).values()):
            state = self._held(ops, name, slot, store, like, state)
        return state

    def _restored(self, ops: Ops, slot: str, store: Store, arrays: Mapping[str, Any], like: Any) -> State:
        _check_store(slot, arrays, store)
        return {key: store.restore(ops, key, value, like) for key, value in arrays.items() if key != "store"}

    def _held(self, ops: Ops, name: str, slot: str, store: Store, like: Any, state: State | None) -> State:
        """For a graph being traced: ``slot``'s state held, a zero residual's where it has none yet."""
        if not store.traceable:
            raise ValueError(f"hvdsketch: residual store {str(store)!r} keeps residuals a traced graph cannot "
                             f"hold (their shape changes, or they live on the host); run the step eagerly, "
                             f"or keep residuals with --memory fp32")
        with ops.outside_trace():
            if state is None:
                state = store.put(ops, None, ops.zeros(ops.shape(like), ops.dtype_name(like), like), name)
            state = holding(ops, state)
        self._state[slot], self._slot_store[slot] = state, store
        return state

    def _set(self, ops: Ops, slot: str, store: Store, state: State | None) -> None:
        current = self._state.get(slot)
        if current is not None and holds(current.values()):  # a traced graph's: written into, never dropped
            if state is not None:
                kept = written(current, state, f"residual {slot!r}")
                if not ops.is_symbolic(next(iter(kept.values()))):
                    self._state[slot] = kept
            return
        if state is None:
            self._state.pop(slot, None)
            self._slot_store.pop(slot, None)
        else:
            self._state[slot] = state
            self._slot_store[slot] = store

    def nbytes(self) -> int:
        """Bytes of residual state kept between steps on the tensors' own device (all but ``offload``);
        a residual taken out by ``compensate`` and not yet back from ``update`` is not counted."""
        return self._bytes(host=False)

    def host_nbytes(self) -> int:
        """Bytes of residual state moved to host memory (``offload``)."""
        return self._bytes(host=True)

    def _bytes(self, host: bool) -> int:
        return sum(backend(value).nbytes(value)
                   for slot, state in self._state.items() if self._slot_store[slot].host == host
                   for key, value in state.items() if key not in self._slot_store[slot].scalars)

    def state_dict(self, residuals: bool = True) -> dict[str, Any]:
        """The memory as nested dicts of numpy arrays (see the module docstring); without
        ``residuals``, its spec and plan alone (nothing read from a tensor)."""
        slots = {slot: dict(arrays) for slot, arrays in self._loaded.items()} if residuals else {}
        for slot, state in self._state.items() if residuals else ():
            store = self._slot_store[slot]
            slots[slot] = {"store": str(store),
                           **{key: store.export(key, value) for key, value in state.items()}}
        return {"spec": self.spec, "default": str(self.default),
                "stores": {name: str(store) for name, store in self.stores.items()},
                "slots": slots}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`; raises ``ValueError`` if it was saved under another spec. A
        residual a traced graph holds is written into its memory now (zeros where ``state`` has none)."""
        if str(state["spec"]) != self.spec:
            raise ValueError(f"hvdsketch: the residual memory was saved with --memory {str(state['spec'])!r}, "
                             f"this run uses {self.spec!r}")
        kept = {slot: (self._slot_store[slot], held) for slot, held in self._state.items() if holds(held.values())}
        for slot, (store, _) in kept.items():
            if slot in state["slots"]:
                _check_store(slot, state["slots"][slot], store)
        self.default = create_store(str(state["default"]))
        self.stores = {name: create_store(str(flag)) for name, flag in state["stores"].items()}
        self._state.clear()
        self._slot_store.clear()
        self._loaded = {slot: dict(arrays) for slot, arrays in state["slots"].items()}
        for slot, (store, held) in kept.items():
            like = next(iter(held.values()))
            ops = backend(like)
            arrays = self._loaded.pop(slot, None)
            loaded = ({key: ops.zeros(ops.shape(v), ops.dtype_name(v), v) for key, v in held.items()} if arrays is None
                      else self._restored(ops, slot, store, arrays, like))
            self._state[slot], self._slot_store[slot] = written(held, loaded, f"residual {slot!r}"), store

    def __str__(self) -> str:
        return self.spec


def _traced(tensor: Any) -> bool:
    return backend(values_of(tensor)).is_symbolic(values_of(tensor))


def _check_store(slot: str, arrays: Mapping[str, Any], store: Store) -> None:
    if str(arrays["store"]) != str(store):
        raise ValueError(f"hvdsketch: residual {slot!r} was saved with store {str(arrays['store'])!r} "
                         f"but this memory keeps it with {str(store)!r}")


def _shape(ops: Ops, tensor: Any) -> tuple[int, ...]:
    return tuple(tensor.dense_shape) if isinstance(tensor, RowSparse) else ops.shape(tensor)


def add(tensor: Any, residual: Any) -> Any:
    """``tensor + residual``, either dense or :class:`RowSparse`: row-sparse when both are (their rows
    side by side), else dense."""
    if isinstance(tensor, RowSparse) and isinstance(residual, RowSparse):
        ops = backend(tensor.values)
        return RowSparse(ops.concat([ops.cast(tensor.indices, "int64"), ops.cast(residual.indices, "int64")]),
                         ops.concat([tensor.values, residual.values]), tensor.dense_shape)
    if isinstance(tensor, RowSparse):
        tensor, residual = residual, tensor
    if isinstance(residual, RowSparse):  # dense + rows: one new tensor, the rows added in place
        ops = backend(tensor)
        rows = ops.reshape(tensor, (ops.shape(tensor)[0], -1))
        return ops.reshape(ops.add_rows(rows, residual.indices, ops.reshape(residual.values, (-1, ops.shape(rows)[1]))),
                           ops.shape(tensor))
    return tensor + residual

