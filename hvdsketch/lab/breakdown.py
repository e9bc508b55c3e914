"""Where a training step's time goes: compute (forward and backward), the codec, waiting on the wire,
and the optimizer's update.

A training record (``hvdsketch train``'s PyTorch loop, the DDP baselines) keeps its median step's
parts, ``timing_s``: ``backward`` (zero_grad, forward and backward, with whatever the gradients'
hooks do meanwhile), ``exchange`` (after backward, waiting for the averaged gradients:
``synchronize()``; a DDP step has none, its hooks finish inside backward) and ``update`` (clipping
and ``optimizer.step()``), and the seconds hvdsketch's exchanger spent in that step by phase:
``start`` (inside the gradients' hooks, so inside backward), ``finish`` (inside ``exchange``, or
inside backward for the DDP hook, whose last bucket finishes the step) and ``codec`` (compressing and
decompressing, within both). From them::

    compute = backward - (the exchanger's time inside backward)
    codec   = codec
    wait    = exchange + (the exchanger's time inside backward) - codec    launching and waiting
    update  = update

so the four add up to the timed step. Horovod's own optimizer shows no phases: its hooks only enqueue
(a drop-in compression's ``compress`` runs in them and counts as compute), ``wait`` is its
``synchronize()`` and the codec is not timed apart. DDP's own allreduce and PowerSGD hook finish
inside backward unseen: no breakdown. The TensorFlow loop is one ``tf.function``: no breakdown.
"""
from __future__ import annotations

from typing import Any

#: The parts, in the order a step runs them (and the stacked plot stacks them).
PARTS = ("compute", "codec", "wait", "update")


def of(record: dict[str, Any]) -> dict[str, float | None] | None:
    """The median step's time by part (seconds; ``codec`` ``None`` where it was not timed apart), or
    ``None`` where the record cannot tell compute from the exchange."""
    timing = record.get("timing_s") or {}
    if "backward" not in timing:
        return None
    exchange, codec = timing.get("exchange"), timing.get("codec")
    if exchange is None and codec is None:
        return None
    in_backward = timing.get("start", 0.0) + (timing.get("finish", 0.0) if exchange is None else 0.0)
    return {"compute": timing["backward"] - in_backward, "codec": codec,
            "wait": (exchange or 0.0) + in_backward - (codec or 0.0), "update": timing["update"]}
