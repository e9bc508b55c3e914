"""The compression flag: ``name[:key=value,...]``, one string for every framework.

It is accepted as a Python argument, as ``--compression``, as the ``HVDSKETCH_COMPRESSION`` environment variable
and under ``compression:`` in a YAML config, in that order of precedence. Values are converted by the type of
their option (``sketch:rows=3`` gives an ``int``); Python keywords (``create("sketch", rows=3)``) are checked
against the same types. Unknown names or keys, values of the wrong type and floats that are not finite raise
:class:`SpecError` naming the option and what it takes.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import os
import types
import typing
from dataclasses import dataclass
from typing import Any, Mapping

ENV_VAR = "HVDSKETCH_COMPRESSION"


class SpecError(ValueError):
    """A compression flag that names no compressor, an unknown key, or a bad value."""


def known_keys(raw: Any, valid: typing.Sequence[str], what: str) -> Mapping[str, Any]:
    """``raw`` where it is a mapping of ``valid`` keys only (a YAML section, a rule), else a
    :class:`SpecError` that starts with ``what`` and names the valid keys."""
    if not isinstance(raw, Mapping):
        raise SpecError(f"{what} must be a mapping with keys {', '.join(valid)}, got {raw!r}")
    unknown = sorted(map(str, set(raw) - set(valid)))
    if unknown:
        raise SpecError(f"{what}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
    return raw


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


def render(options: Any) -> str:
    """The canonical flag of a frozen dataclass whose fields are a flag's options (a compressor, a
    residual store): its ``name`` and, in field order, the options not at their default."""
    opts = ",".join(f"{f.name}={getattr(options, f.name)}" for f in dataclasses.fields(options)
                    if f.init and getattr(options, f.name) != f.default)
    return f"{options.name}:{opts}" if opts else options.name


def _alternatives(kind: Any) -> tuple[list[Any], bool]:
    """The types a field of type ``kind`` takes, and whether it takes ``None``."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = typing.get_args(kind)
        return [k for k in args if k is not type(None)], type(None) in args
    return [kind], False


def describe(kind: Any) -> str:
    """What a field of type ``kind`` takes, in words: ``an int``, ``a float or none``, ``one of a, b``."""
    kinds, optional = _alternatives(kind)
    words = []
    for k in kinds:
        if typing.get_origin(k) is typing.Literal:
            words.append("one of " + ", ".join(map(str, typing.get_args(k))))
        else:
            name = getattr(k, "__name__", str(k))
            words.append(("an " if name[0] in "aeiou" else "a ") + name)
    return " or ".join(words) + (" or none" if optional else "")


def _finite(value: float, where: str) -> float:
    if not math.isfinite(value):
        raise SpecError(f"{where}: {value} is not a finite number")
    return value


def _convert(text: str, kind: Any, where: str) -> Any:
    """The value a flag's ``text`` gives a field of type ``kind``."""
    kinds, optional = _alternatives(kind)
    if optional and text.lower() == "none":
        return None
    kind = kinds[0]
    if typing.get_origin(kind) is typing.Literal:
        allowed = typing.get_args(kind)
        if text not in allowed:
            raise SpecError(f"{where}: {text!r} is not one of {', '.join(map(str, allowed))}")
        return text
    try:
        if kind is bool:
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return text.lower() in ("true", "1", "yes")
        value = kind(text)
    except ValueError:
        raise SpecError(f"{where}: {text!r} is not a valid {getattr(kind, '__name__', kind)}") from None
    return _finite(value, where) if kind is float else value


def coerce(value: Any, kind: Any, where: str) -> Any:
    """``value`` (a keyword argument, a YAML value) for a field of type ``kind``: text converted as in a flag,
    an ``int`` taken as a ``float``; a wrong type or non-finite float raises :class:`SpecError` naming ``where``."""
    kinds, optional = _alternatives(kind)
    if value is None and optional:
        return None
    if isinstance(value, str) and str not in kinds:
        return _convert(value, kind, where)
    for k in kinds:
        if typing.get_origin(k) is typing.Literal:
            if value in typing.get_args(k):
                return value
        elif k is float:
            if isinstance(value, numbers.Real) and not isinstance(value, bool):
                return _finite(float(value), where)
        elif k is int:
            if isinstance(value, numbers.Integral) and not isinstance(value, bool):
                return int(value)
        elif isinstance(value, typing.get_origin(k) or k):
            return value
    raise SpecError(f"{where} takes {describe(kind)}, got {value!r} ({type(value).__name__})")


def build(spec: "str | Spec", registry: Mapping[str, type], kind: str = "compressor", **options: Any) -> Any:
    """Instantiate the dataclass that ``registry`` holds under the spec's name, options from the spec's text or,
    for a bare name, keyword arguments (``build("sketch", registry, rows=3)``); raises :class:`SpecError`."""
    if not isinstance(spec, Spec) and (not isinstance(spec, str) or not spec.strip()):
        raise SpecError(f"a {kind} flag must be a non-empty string naming one of {', '.join(sorted(registry))} "
                        f"(options as name:key=value), got {spec!r}")
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
    kwargs = ({k: _convert(v, fields[k], f"{spec.name}:{k}") for k, v in spec.options.items()}
              or {k: coerce(v, fields[k], f"{spec.name}:{k}") for k, v in options.items()})
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise SpecError(f"{spec.name}: {err}") from None


def _blank(value: Any) -> bool:
    """An empty flag: blank text, or an empty mapping or list of rules."""
    return not value.strip() if isinstance(value, str) else isinstance(value, (Mapping, list)) and not value


def resolve(argument: str | None = None, cli: str | None = None,
            config: Mapping[str, Any] | None = None, key: str = "compression",
            env_var: str = ENV_VAR, default: str = "none") -> "str | Mapping[str, Any] | list":
    """The flag in force: Python argument, then ``--compression``, the environment, the YAML config, ``default``;
    a config's mapping or list of rules (:mod:`hvdsketch.policy`) is returned as is. An empty argument,
    ``--compression`` or config value raises :class:`SpecError`; an empty environment variable counts as unset."""
    config = config or {}
    if key in config and (config[key] is None or _blank(config[key])):
        raise SpecError(f"{key!r} in the config is empty; give a flag such as 'sketch:error=0.5' "
                        f"(or {default!r}), or leave the key out")
    for candidate, where in ((argument, f"{key}="), (cli, f"--{key} "), (os.environ.get(env_var), None),
                             (config.get(key), None)):
        if candidate is None or (where is None and _blank(candidate)):
            continue
        if _blank(candidate):
            raise SpecError(f"{where}{candidate!r} is empty; give a flag such as 'sketch:error=0.5' "
                            f"(or {default!r}, the default), or leave it unset")
        return candidate if isinstance(candidate, (Mapping, list)) else str(candidate)
    return default
