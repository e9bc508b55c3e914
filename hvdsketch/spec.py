"""The compression flag: ``name[:key=value,...]``, one string for every framework.

The same string is accepted as a Python argument, as ``--compression`` on the
command line, as the ``HVDSKETCH_COMPRESSION`` environment variable and under
``compression:`` in a YAML config, in that order of precedence. Values are
converted by the type of the option they name, so ``sketch:rows=3`` gives an
``int``; unknown names or keys raise :class:`SpecError` listing the valid ones.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import types
import typing
from dataclasses import dataclass
from typing import Any, Mapping

ENV_VAR = "HVDSKETCH_COMPRESSION"


class SpecError(ValueError):
    """A compression flag that names no compressor, an unknown key, or a bad value."""


@dataclass(frozen=True)
class Spec:
    """A parsed flag: a compressor's name and its options as written."""

    name: str
    options: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def parse(cls, text: "str | Spec") -> "Spec":
        if isinstance(text, Spec):
            return text
        if not isinstance(text, str) or not text.strip():
            raise SpecError(f"compression spec must be a non-empty string like 'sketch:error=0.5', got {text!r}")
        name, _, rest = text.strip().partition(":")
        options: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in rest.split(","))):
            key, eq, value = item.partition("=")
            if not eq or not key.strip() or not value.strip():
                raise SpecError(f"bad option {item!r} in {text!r}: expected key=value")
            if key.strip() in options:
                raise SpecError(f"option {key.strip()!r} given twice in {text!r}")
            options[key.strip()] = value.strip()
        return cls(name.strip().lower(), options)

    def __str__(self) -> str:
        body = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return f"{self.name}:{body}" if body else self.name

    def digest(self) -> int:
        """A 31-bit hash of the canonical text, equal on every rank that runs the same spec."""
        return int.from_bytes(hashlib.sha256(str(self).encode()).digest()[:4], "little") >> 1


def _convert(text: str, kind: Any, where: str) -> Any:
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        kinds = [k for k in typing.get_args(kind) if k is not type(None)]
        if text.lower() == "none":
            return None
        kind = kinds[0]
    if origin is typing.Literal:
        allowed = typing.get_args(kind)
        if text not in allowed:
            raise SpecError(f"{where}: {text!r} is not one of {', '.join(map(str, allowed))}")
        return text
    try:
        if kind is bool:
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return text.lower() in ("true", "1", "yes")
        return kind(text)
    except ValueError:
        raise SpecError(f"{where}: {text!r} is not a valid {getattr(kind, '__name__', kind)}") from None


def build(spec: "str | Spec", registry: Mapping[str, type], kind: str = "compressor", **options: Any) -> Any:
    """Instantiate the dataclass that ``registry`` holds under the spec's name.

    Options come from the spec's text (converted by field type) or, for a bare
    name, as Python keyword arguments (``build("sketch", registry, rows=3)``).
    """
    spec = Spec.parse(spec)
    if spec.options and options:
        raise SpecError(f"give options either in the spec {str(spec)!r} or as keywords, not both")
    if spec.name not in registry:
        raise SpecError(f"unknown {kind} {spec.name!r}; valid: {', '.join(sorted(registry))}")
    cls = registry[spec.name]
    hints = typing.get_type_hints(cls)
    fields = {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}
    unknown = sorted((set(spec.options) | set(options)) - set(fields))
    if unknown:
        valid = ", ".join(sorted(fields)) or "(none)"
        raise SpecError(f"unknown option(s) {', '.join(unknown)} for {spec.name!r}; valid: {valid}")
    kwargs = {k: _convert(v, fields[k], f"{spec.name}:{k}") for k, v in spec.options.items()} or options
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise SpecError(f"{spec.name}: {err}") from None


def resolve(argument: str | None = None, cli: str | None = None,
            config: Mapping[str, Any] | None = None, key: str = "compression",
            env_var: str = ENV_VAR, default: str = "none") -> "str | Mapping[str, Any] | list":
    """The flag in force: Python argument, then ``--compression``, then the
    environment, then the YAML config, then ``default``. A config may give a
    mapping or list (per-tensor rules, :mod:`hvdsketch.policy`), returned as is."""
    for candidate in (argument, cli, os.environ.get(env_var), (config or {}).get(key)):
        if isinstance(candidate, (Mapping, list)) and candidate:
            return candidate
        if candidate is not None and str(candidate).strip():
            return str(candidate)
    return default
