"""The policy one compression flag (or one compressor or policy object) names: ``auto`` or a compressor."""
from __future__ import annotations

from hvdsketch import spec as _spec
from hvdsketch.compress import Compressor
from hvdsketch.compress import create as create_compressor
from hvdsketch.policy.auto import AutoOptions, AutoPolicy
from hvdsketch.policy.base import Fixed, Policy


def from_flag(flag: "str | Compressor | Policy") -> Policy:
    """``auto[:...]`` as :class:`AutoPolicy`, a compressor flag or object as :class:`Fixed`, a policy
    as it is; raises :class:`hvdsketch.spec.SpecError` naming the valid choices."""
    if isinstance(flag, Policy):
        return flag
    if isinstance(flag, Compressor):
        return Fixed(flag)
    if _spec.Spec.parse(flag).name == AutoOptions.name:
        return AutoPolicy(flag)
    return Fixed(create_compressor(flag))
