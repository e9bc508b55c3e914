"""The FSDP2 benchmark's matrix and its target, without running it."""
from pathlib import Path

from hvdsketch.lab.bench.matrix import Matrix
from hvdsketch.lab.bench.spread import Spread
from hvdsketch.lab.bench.targets import FSDP_OURS, MET, MISSED, UNDECIDED, Outcome, fastest_within_spread

ROOT = Path(__file__).resolve().parents[2]


def test_the_matrix_runs_every_entry_at_2_and_4_ranks_on_1gbit_links_3_times():
    matrix = Matrix.load(str(ROOT / "configs" / "bench-fsdp.yaml"))
    jobs = matrix.jobs()
    labels = {j.label for j in jobs}
    assert {"fsdp-fp32", "fsdp-bf16"} | set(FSDP_OURS) == labels
    assert {(j.rate, j.ranks) for j in jobs} == {("1gbit", 2), ("1gbit", 4)} and len(jobs) == 3 * 2 * len(labels)
    assert all(j.entry.available for j in jobs)
    assert matrix.baseline == "fsdp-bf16"


def outcome(step: tuple[float, float, float], quality: tuple[float, float, float]) -> Outcome:
    return Outcome(Spread(*step, 3), Spread(*quality, 3), higher_is_better=False)


def test_the_target_takes_the_fastest_entry_and_the_baselines_seed_spread():
    check = fastest_within_spread(FSDP_OURS, 1.3)
    base = outcome((400, 390, 410), (100, 98, 102))
    fast = {"fsdp-bf16": base, "fsdp-hvdsketch-rows": outcome((300, 290, 305), (101, 100, 102)),
            "fsdp-hvdsketch-auto": outcome((290, 280, 295), (100, 99, 101))}
    measured, word = check(fast, "best", "fsdp-bf16")
    assert measured.startswith("fsdp-hvdsketch-auto") and word == MET
    off = {**fast, "fsdp-hvdsketch-auto": outcome((290, 280, 295), (105, 104, 106))}
    assert check(off, "best", "fsdp-bf16")[1] == MISSED  # fastest, but its perplexity outside the seeds' spread
    close = {"fsdp-bf16": base, "fsdp-hvdsketch-fp16": outcome((320, 280, 340), (100, 99, 101))}
    assert check(close, "best", "fsdp-bf16")[1] == UNDECIDED
    assert check({"fsdp-bf16": base}, "best", "fsdp-bf16") is None
