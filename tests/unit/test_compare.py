"""``hvdsketch compare``: one run's median step time and bytes against a dense run's records."""
from __future__ import annotations

import json
import os

import pytest

from hvdsketch.lab.compare import load, summary
from hvdsketch.spec import SpecError


def record(compression: str, steps: list[float], sent: float, dense: float = 24.73e6, size: int = 2) -> dict:
    return {"workload": "LSTMLanguageModel(...)", "config": {"workload": "lstm:sparse=true"}, "size": size,
            "compression": compression, "steps_s": steps, "bytes_sent_per_step": sent,
            "bytes_dense_per_step": dense}


def test_the_line_gives_median_steps_after_the_first_and_the_bytes_ratio():
    dense = record("none", [9.0, 0.6, 0.5, 0.7], 24.73e6)
    run = record("auto:bandwidth=1gbit", [5.0, 0.2, 0.3, 0.25, 0.9], 6.0e6)
    assert summary(dense, run) == ("== lstm, 2 ranks, auto against dense: step 275.0 vs 600.0 ms (2.18x faster), "
                                   "6 vs 24.73 MB a step (4.12x fewer bytes)")


def test_records_that_do_not_compare_are_refused():
    dense, run = record("none", [1.0, 1.0], 24.73e6), record("auto", [1.0, 0.5], 6e6)
    with pytest.raises(SpecError, match="size"):
        summary(dense, record("auto", [1.0, 0.5], 6e6, size=4))
    with pytest.raises(SpecError, match="not none"):
        summary(run, dense)


def test_a_folder_gives_its_newest_record(tmp_path):
    (tmp_path / "old.json").write_text(json.dumps(record("none", [1.0], 1.0)))
    newest = tmp_path / "new.json"
    newest.write_text(json.dumps(record("fp16", [1.0], 1.0)))
    os.utime(tmp_path / "old.json", (0, 0))
    assert load(str(tmp_path))["compression"] == "fp16"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SpecError, match="no record"):
        load(str(empty))
