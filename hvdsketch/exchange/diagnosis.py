"""What a rank can say when an averaged gradient is not finite, and which dtypes need carrying.

One rank's NaN or Inf reaches every rank's average; each rank adds whether its own gradient was finite,
and, where it was and the wire carried a 16-bit dtype, names overflow on the wire and its fix.
"""
from __future__ import annotations

class NonfiniteStep(UserWarning):
    """A step whose average was NaN or Inf, handed back for a loss scaler to skip, hvdsketch's state
    left as before it (the default, ``error_if_nonfinite=False``)."""


#: Gradient dtypes that Horovod's collectives cannot carry, and the dtype they are exchanged in.
CARRIED_AS = {"bfloat16": "float32"}
#: 16-bit dtypes on the wire and their largest finite value: a finite gradient beyond it overflows.
NARROW = {"float16": 65504.0}


def nonfinite_message(name: str, where: str, finite_here: bool | None, narrow: str | None = None,
                      compressor: str | None = None) -> str:
    """Why gradient ``name``'s average is NaN or Inf, as far as ``where`` (``"rank 3"``) can tell from
    ``finite_here`` (``None``: unknown) and the wire's ``narrow`` dtype, sent by ``compressor``."""
    if finite_here is False:
        return f"hvdsketch: gradient {name} is NaN or Inf on {where} (and so in every rank's average)"
    if narrow is None:
        return f"hvdsketch: gradient {name} is NaN or Inf on some rank" + (
            f" (finite on {where}: another rank's is not)" if finite_here else "")
    here = f"it is finite on {where}:" if finite_here else "unless a rank's gradient is NaN or Inf,"
    return (f"hvdsketch: gradient {name} overflowed {narrow} on the wire: {here} some rank's values, or "
            f"their sum, exceed {narrow}'s largest value {NARROW[narrow]:g} ({compressor} sends {narrow})"
            + (", or another rank's gradient is NaN or Inf" if finite_here else "")
            + "; scale the loss or gradients down, or use a compression that sends float32")
