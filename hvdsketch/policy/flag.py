"""The policy one compression flag (or one compressor or policy object) names: ``auto`` or a compressor."""
from __future__ import annotations

from typing import Any

from hvdsketch import spec as _spec
from hvdsketch.compress import Compressor, create
from hvdsketch.policy.auto import AutoOptions, AutoPolicy
from hvdsketch.policy.base import Fixed, Policy


#: Horovod's own compressions and the flag each is.
HOROVOD = {"NoneCompressor": "none", "FP16Compressor": "fp16"}


def unwrapped(compression: Any) -> Any:
    """A value for Horovod's ``compression=`` (hvdsketch's drop-in compression, or Horovod's ``Compression.none``
    / ``.fp16``) as the compressor or flag it carries; anything else as it is."""
    inner = getattr(compression, "compressor", None)
    if isinstance(inner, Compressor) and hasattr(compression, "compress"):
        return inner
    if isinstance(compression, type) and compression.__module__.startswith("horovod."):
        if compression.__name__ not in HOROVOD:
            raise _spec.SpecError(f"hvdsketch: Horovod's compression {compression.__name__} has no hvdsketch "
                                  f"counterpart; give a flag such as 'fp16' or 'sketch'")
        return HOROVOD[compression.__name__]
    return compression


def from_flag(flag: "str | Compressor | Policy") -> Policy:
    """``auto[:...]`` as :class:`AutoPolicy`, a compressor flag or object as :class:`Fixed`, a policy
    as it is; raises :class:`hvdsketch.spec.SpecError` naming the valid choices."""
    if isinstance(flag, Policy):
        return flag
    if isinstance(flag, Compressor):
        return Fixed(flag)
    if _spec.Spec.parse(flag).name == AutoOptions.name:
        return AutoPolicy(flag)
    return Fixed(create(flag))
