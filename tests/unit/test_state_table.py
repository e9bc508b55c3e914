"""The per-tensor state table: records by name with the compressor that made them, through a
checkpoint and back, and afresh for a tensor that meets another compressor."""
import numpy as np
import torch

from hvdsketch.compress import TensorContext, create
from hvdsketch.exchange.flight import run_local
from hvdsketch.compress.state import StateTable


def trained(flag: str, steps: int = 3) -> StateTable:
    table, g = StateTable(), torch.from_numpy(np.random.default_rng(0).standard_normal((40, 30)).astype(np.float32))
    for step in range(steps):
        run_local(create(flag), g, TensorContext("w", (40, 30), step, 1), states=table)
    return table


def test_a_checkpoint_of_the_table_restores_each_record_under_its_compressor():
    table = trained("powersgd:rank=2")
    saved = table.state_dict()
    assert saved["w"]["compressor"] == "powersgd:rank=2" and isinstance(saved["w"]["state"]["q"], np.ndarray)
    restored = StateTable()
    restored.load_state_dict(saved, lambda name, array: torch.from_numpy(array), create)
    # saved again as it was loaded
    assert restored.state_dict()["w"]["compressor"] == "powersgd:rank=2"
    np.testing.assert_array_equal(restored.state_dict()["w"]["state"]["q"], saved["w"]["state"]["q"])
    q = restored.get("w", create("powersgd:rank=2")).q
    assert isinstance(q, torch.Tensor) and torch.equal(q, table.get("w", create("powersgd:rank=2")).q)


def test_a_tensor_that_meets_another_compressor_starts_afresh_and_counters_stay_ints():
    table = trained("sketch:error=0.5")
    level = table.get("w", create("sketch:error=0.5")).level
    assert isinstance(level, int)
    assert table.get("w", create("sketch:error=0.25")) == create("sketch").initial_state()
    assert table.get("w", create("powersgd")).q is None
    assert table.get("v", create("sketch:error=0.5")).level is None  # another tensor
    restored = StateTable()
    restored.load_state_dict(table.state_dict(), lambda name, array: torch.from_numpy(array), create)
    assert restored.get("w", create("sketch:error=0.5")).level == level


def test_a_method_without_state_keeps_no_entry():
    table = trained("topk:ratio=0.1")
    assert table.state_dict() == {} and table.get("w", create("topk:ratio=0.1")) is None


def test_dgc_writes_its_momentum_into_two_buffers_in_turn_and_records_taken_before_keep_their_values():
    """Nothing new is made after the second step, and a step never writes into the record it started
    from (a step left without trace goes back to it), nor into a checkpoint taken before."""
    compressor, table = create("dgc:ratio=0.1,momentum=0.9,sample=1"), StateTable()
    rng = np.random.default_rng(5)
    velocities, saved, records = [], [], []
    for step in range(4):
        g = torch.from_numpy(rng.standard_normal((40, 30)).astype(np.float32))
        run_local(compressor, g, TensorContext("w", (40, 30), step, 1), states=table)
        velocity = table.get("w", compressor).velocity
        velocities.append(velocity.data_ptr())
        assert velocity.data_ptr() != g.data_ptr()  # the state's own memory, never the gradient's
        saved.append((velocity.clone(), table.state_dict()["w"]["state"]["velocity"]))
        records.append(table.get("w", compressor))
    assert velocities[0] == velocities[2] != velocities[1] == velocities[3]
    assert torch.equal(records[-2].velocity, saved[-2][0])
    for at_save, in_checkpoint in saved:
        np.testing.assert_array_equal(in_checkpoint, at_save.numpy())
