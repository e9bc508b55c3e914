"""README.md, a newcomer's five minutes: short, its first screen holds install, each front end's
one-line change and the "which flag" table, its headline results are bench.md's own figures, and
every file it or results/README.md links to exists."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BENCH = (ROOT / "results" / "bench-train" / "bench.md").read_text()
#: A figure with its spread, as bench.md prints it: "4.755 (4.655..4.905)".
FIGURE = re.compile(r"([\d.]+) \(([\d.]+)\.\.([\d.]+)\)")


def test_the_readme_is_at_most_250_lines():
    assert len(README.splitlines()) <= 250


def test_its_first_screen_holds_install_each_front_ends_one_line_change_and_which_flag():
    first_screen = "\n".join(README.splitlines()[:60])
    for needed in ("## Install", "pip install hvdsketch", 'pip install "hvdsketch[lab]"',
                   "## The one-line change",
                   "hvdsketch.torch.DistributedOptimizer(",                  # Horovod with PyTorch
                   "hvdsketch.tensorflow.DistributedGradientTape(",          # Horovod with TensorFlow
                   "hvdsketch.tensorflow.keras.DistributedOptimizer(",       # tf-keras
                   "register_comm_hook(hvdsketch.torch.ddp.ExchangeState(",  # PyTorch DDP
                   "hvdsketch.torch.fsdp.compress(",                         # PyTorch FSDP2
                   "## Which flag", "| `allgather` |", "| `balanced` |", "| `auto` |", "| `none` |"):
        assert needed in first_screen, needed


def test_it_names_the_two_commands():
    assert "bash launch/run.sh" in README and "bash launch/test.sh" in README


def headline_rows() -> list[list[str]]:
    """The results table's rows: workload, hvdsketch entry, its step, the other entry, its step, ratio."""
    section = README.split("## Results", 1)[1].split("\n## ", 1)[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| workload")]
    assert rows, "the Results section has no table"
    return rows


@pytest.mark.parametrize("row", headline_rows(), ids=lambda row: row[0])
def test_each_headline_figure_is_bench_mds_and_its_ratio_follows_from_them(row):
    _, _, ours, _, theirs, ratio = row
    assert ours in BENCH and theirs in BENCH  # median (min..max) as the run printed it
    (ours_median, ours_low, ours_high), (their_median, their_low, their_high) = (
        map(float, FIGURE.fullmatch(cell).groups()) for cell in (ours, theirs))
    speedup, low, high = map(float, FIGURE.fullmatch(ratio.replace("x", "")).groups())
    # the ratio of medians, its range the extreme ratios (3 repeats), each to 3 significant digits
    assert speedup == pytest.approx(their_median / ours_median, rel=6e-3)
    assert low == pytest.approx(their_low / ours_high, rel=6e-3)
    assert high == pytest.approx(their_high / ours_low, rel=6e-3)


@pytest.mark.parametrize("document", ["README.md", "results/README.md"])
def test_every_file_it_links_to_exists(document):
    text = (ROOT / document).read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert targets
    broken = [t for t in targets if "://" not in t and not (ROOT / document).parent.joinpath(t).exists()]
    assert broken == []
