"""Every residual store by its flag name, and the store a ``--memory`` flag names."""
from __future__ import annotations

from hvdsketch import spec as _spec
from hvdsketch.memory.sketch import SketchStore
from hvdsketch.memory.stores import Bf16, Fp16, Fp32, Nothing, Offload, Shared, Store, TopK

#: Every store by its flag name.
REGISTRY: dict[str, type[Store]] = {
    cls.name: cls for cls in (Nothing, Fp32, Fp16, Bf16, TopK, SketchStore, Shared, Offload)
}


def create_store(flag: "str | _spec.Spec") -> Store:
    """The store a flag names (``"topk:ratio=0.1"``), options validated."""
    return _spec.build(flag, REGISTRY, kind="residual store")
