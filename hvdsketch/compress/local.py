"""A compressor's whole exchange over this rank alone, without error feedback: what the cost model times."""
from __future__ import annotations

import dataclasses
from typing import Any

from hvdsketch.compress.base import Compressor, Message, TensorContext


def run_alone(compressor: Compressor, tensor: Any, ctx: TensorContext) -> tuple[Any, list[list[Message]]]:
    """Run ``compressor``'s rounds on ``tensor`` from its initial state, each round's reduction over
    one rank being its own messages.

    Returns:
        The result and every round's messages.
    """
    if ctx.state is None and compressor.State is not None:
        ctx = dataclasses.replace(ctx, state=compressor.initial_state())
    tensor, ctx = compressor.prepare(tensor, ctx)
    rounds = compressor.exchange(tensor, ctx)
    sent = [next(rounds).messages]
    while True:
        try:
            sent.append(rounds.send([m.tensor for m in sent[-1]]).messages)
        except StopIteration as end:
            return end.value[0], sent
