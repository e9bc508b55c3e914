"""The training benchmark's parts: matrix config, targets, tables, plots, the scaling model (its byte
formulas against hvdsketch's MPI counters, under a real mpirun), and one tiny real run on cluster.sh."""
import argparse
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from hvdsketch.lab.bench import report, scaling, train, watch
from hvdsketch.lab.bench.matrix import Entry, Matrix
from hvdsketch.lab.bench.quality import times_to_target
from hvdsketch.lab.bench.spread import Spread
from hvdsketch.lab.bench.targets import MET, MISSED, UNDECIDED, Outcome, combine, evaluate, judge
from hvdsketch.lab.bench.train import (Result, _why, carried, earlier_results, markdown, ordered, outcomes, plots,
                                       probe_notice, probe_problem)
from hvdsketch.spec import Spec, SpecError
from tests import needs
from tests.spawn import clean_env, launched

ROOT = Path(__file__).resolve().parents[2]


# --- report ---------------------------------------------------------------------------------------


def test_markdown_pads_columns_and_right_aligns_numbers():
    text = report.markdown(["entry", "ms"], [["dense", "1002"], ["sketch", "88.7"], ["failed", "-"]])
    lines = text.splitlines()
    assert lines[0] == "| entry  |   ms |"
    assert lines[1] == "|--------|-----:|"
    assert lines[3] == "| sketch | 88.7 |"
    assert len({len(line) for line in lines}) == 1
    with pytest.raises(ValueError, match="2 cells"):
        report.markdown(["a", "b"], [["1"]])


def test_number_formats_and_marks_missing_values():
    assert report.number(1234.5, 3) == "1.23e+03"
    assert report.number(0.01234, 2, "x") == "0.012x"
    assert report.number(None) == report.number(float("nan")) == "-"


# --- the matrix -----------------------------------------------------------------------------------


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


@pytest.fixture
def bench_config(tmp_path):
    train = write(tmp_path, "w.yaml", "workload: fashion\nlr: 0.05\nepochs: 9\n")
    return write(tmp_path, "bench.yaml", f"""\
        rates: [1gbit, 10gbit]
        ranks: [2, 4]
        workloads:
          fashion: {{config: {train}, epochs: 2, steps_per_epoch: 30, probe: "0.weight"}}
          other: {{config: {train}}}
        entries:
          - {{label: dense, compression: none, path: horovod}}
          - {{label: sketch, compression: {{rules: [{{name: "0.*", compression: sketch}}], default: none}}, momentum: 0}}
          - {{label: peer, compression: topk, workloads: [other]}}
        quick: {{workloads: [fashion], entries: [dense, sketch], rates: [1gbit], ranks: [2], steps_per_epoch: 3,
                 repeats: 2}}
        """)


def test_matrix_orders_jobs_cell_by_cell_in_interleaved_rounds_with_the_probe_last(bench_config):
    matrix = Matrix.load(bench_config)
    keys = [j.key for j in matrix.jobs()]
    first = ["fashion-1gbit-np2-dense", "fashion-1gbit-np2-sketch", "fashion-1gbit-np2-exchange-probe"]
    assert keys[:9] == [f"{k}-r{r}" for r in (1, 2, 3) for k in first]  # A B P A B P A B P, 3 repeats by default
    assert len(keys) == 3 * (4 * 3 + 4 * 3)  # fashion: 2 entries + probe; other: 3 entries, no probe
    quick = Matrix.load(bench_config, quick=True)
    assert [j.key for j in quick.jobs()] == [f"{k}-r{r}" for r in (1, 2) for k in first]  # quick: repeats: 2
    assert quick.workloads[0].steps_per_epoch == 3 and quick.workloads[0].epochs == 2
    assert len(matrix.select(repeats=1).jobs()) == len(keys) // 3
    with pytest.raises(SpecError, match="repeats must be a positive integer"):
        matrix.select(repeats=0)


def test_each_run_gets_its_config_with_the_entry_laid_over_the_workload(bench_config, tmp_path):
    import yaml

    job = Matrix.load(bench_config).jobs()[1]
    command = job.command(tmp_path / "run", [])
    assert command[-4:] == ["--config", str(tmp_path / "run" / "config.yaml"), "--out", str(tmp_path / "run")]
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["lr"] == 0.05 and config["epochs"] == 2 and config["steps_per_epoch"] == 30
    assert config["compression"]["rules"][0]["compression"] == "sketch" and config["momentum"] == 0
    probe = Matrix.load(bench_config).jobs()[2]
    entries = [Entry(label="dense", path="horovod"), Entry(label="ag", path="horovod", sparse_as_dense=False)]
    assert "exchange" in probe.command(tmp_path / "probe", entries)
    back = [Entry.from_mapping(e) for e in yaml.safe_load((tmp_path / "probe" / "entries.yaml").read_text())]
    assert back == entries


@pytest.mark.parametrize("select, message", [
    ({"entries": ["dense", "nope"]}, r"unknown entry\(s\) nope; valid: dense, sketch, peer"),
    ({"workloads": ["lstm"]}, r"unknown workload\(s\) lstm; valid: fashion, other"),
])
def test_unknown_names_are_clear_errors(bench_config, select, message):
    with pytest.raises(SpecError, match=message):
        Matrix.load(bench_config).select(**select)


def test_bad_matrices_are_clear_errors(tmp_path):
    twice = write(tmp_path, "b.yaml", "workloads: {w: {config: x.yaml}}\n"
                                      "entries: [{label: a}, {label: a, compression: fp16}]\n")
    with pytest.raises(SpecError, match="labels must be unique"):
        Matrix.load(twice)
    unknown = write(tmp_path, "c.yaml", "workloads: {w: {config: x.yaml}}\nentries: [{label: a, compresion: fp16}]\n")
    with pytest.raises(SpecError, match="unknown key.*compresion"):
        Matrix.load(unknown)
    with pytest.raises(SpecError, match="needs entries"):
        Matrix.load(write(tmp_path, "d.yaml", "workloads: {w: {config: x.yaml}}\n"))


def test_a_missing_runner_module_is_unavailable():
    assert Entry("ddp", runner="hvdsketch.lab.bench.no_such_module").available is False
    assert Entry("dense").available and Entry("x", runner="hvdsketch.lab.bench.report").available


# --- targets and the report -----------------------------------------------------------------------


def record(step_s, quality, metric="perplexity", epochs=2, spike=0.0):
    steps = [step_s] * (10 * epochs - 1) + [step_s + spike]  # a spike moves the mean, not the median
    return {"step_s": sum(steps) / len(steps), "steps_s": steps, "steps": 10 * epochs, "exchange_s": step_s / 2,
            "timing_s": {"backward": step_s * 0.4, "exchange": step_s / 2, "update": step_s * 0.1,
                         "start": 0.01, "finish": 0.1, "codec": 0.03},
            "phases_s": {"start": 0.01, "finish": 0.1, "codec": 0.03}, "epochs": epochs,
            "bytes_sent_per_step": 1e6, "bytes_dense_per_step": 4e6,
            "validation": [{metric: quality * 1.5}, {metric: quality}]}


def result(workload, label, rate="1gbit", ranks=2, status="ok", rec=None, runner="train", repeat=1):
    return Result(f"{workload}-{rate}-np{ranks}-{label}-r{repeat}", workload, rate, ranks, label, runner, status,
                  record=rec, message="" if status == "ok" else "exit 1: boom", repeat=repeat)


def test_targets_are_met_missed_or_not_measured():
    cells = {
        ("lstm", "1gbit", 2): {"dense": Outcome(1.0, 100.0, False, 0.5), "sketch": Outcome(0.8, 101.0, False, 0.05),
                               "dropin-sketch": Outcome(0.9, 101.0, False)},
        ("lstm", "1gbit", 4): {"dense": Outcome(1.0, 100.0, False, 0.5), "sketch": Outcome(1.2, 103.0, False, 0.2),
                               "dropin-sketch": Outcome(0.9, 103.0, False)},
        ("fasttext", "1gbit", 4): {"dense": Outcome(1.0, 0.5, True), "auto": Outcome(0.05, 0.498, True),
                                   "hvd-allgather": Outcome(0.06, 0.5, True),
                                   "sketch": Outcome(0.1, 0.49, True, codec_s=0.01),
                                   "sketch-ef": Outcome(0.12, 0.5, True, codec_s=0.03),
                                   "ddp-hook-auto": Outcome(0.07, 0.5, True), "ddp-hook-auto-mpi": Outcome(0.05, 0.5, True)},
        ("fashion", "1gbit", 2): {"dense": Outcome(1.0, 0.8, True), "none": Outcome(None, None, True)},
    }
    ran = list(cells) + [("fashion", "1gbit", 4)]
    verdicts = {(v.subject, v.workload, v.ranks, v.target): v for v in evaluate(cells, "sketch", "dense", ran)}
    assert verdicts["sketch", "lstm", 2, "embedding exchange"].met is True  # 0.1x
    assert verdicts["sketch", "lstm", 4, "embedding exchange"].met is False  # 0.4x
    assert verdicts["dropin-sketch", "lstm", 2, "drop-in sketch"].met is True  # faster, +1%
    assert verdicts["dropin-sketch", "lstm", 4, "drop-in sketch"].met is False  # +3% perplexity
    assert verdicts["auto", "fasttext", 4, "auto vs sparse allgather"].met is True
    assert verdicts["auto", "fasttext", 4, "auto quality"].met is True  # 0.4% lower accuracy
    assert verdicts["sketch-ef", "fasttext", 4, "sketch EF codec"].met is False  # 3x the sketch's codec
    assert verdicts["none", "fashion", 2, "hvdsketch none"].met is None  # the run failed
    assert verdicts["none", "fashion", 4, "hvdsketch none"].word == "not measured"  # nothing ran
    assert verdicts["ddp-hook-auto", "fasttext", 4, "hook vs sparse allgather"].met is False  # 0.07 against 0.06
    assert verdicts["ddp-hook-auto-mpi", "fasttext", 4, "hook vs sparse allgather"].met is True
    assert verdicts["ddp-hook-auto", "lstm", 2, "hook vs DDP+PowerSGD"].word == "not measured"


def test_time_to_target_picks_the_best_of_ours_against_every_other_entry():
    def at(seconds):
        return Outcome(1.0, 100.0, False, time_to_target_s=seconds)

    cells = {("lstm", "1gbit", 2): {"dense": at(100.0), "sketch": at(60.0), "auto": at(40.0), "topk": at(50.0)},
             ("lstm", "1gbit", 4): {"dense": at(100.0), "union": at(30.0), "powersgd": at(20.0),
                                    "allgather": at(math.inf)}}  # never
    verdicts = {(v.ranks, v.target): v for v in evaluate(cells, "sketch", "dense", cells)}
    assert verdicts[2, "time to target"].met is True and "auto 40 s, 2.5x dense" in verdicts[2, "time to target"].measured
    assert verdicts[4, "time to target"].met is False  # powersgd is sooner than the best of ours
    assert verdicts[4, "exact reaches dense"].met is False  # allgather never reached it


def test_time_to_target_holds_each_seed_to_dense_from_the_same_seed():
    """Dense ends at perplexity 200 from seed 1 and 150 from seed 2 (their mean: 175). Each run is held
    to dense's end from its own seed, so dense reaches its own in every seed, and the entry reaches
    seed 1's after one epoch and never seed 2's."""
    def seeded(seed, values):
        return {**record(0.1, values[-1], epochs=len(values)), "validation": [{"perplexity": v} for v in values],
                "config": {"workload": f"lstm:batch_size=4,seed={seed}"}}

    runs = [("lstm", "none", 2, "dense", seeded(1, [300, 200])), ("lstm", "none", 2, "dense", seeded(2, [250, 150])),
            ("lstm", "none", 2, "sketch", seeded(1, [190, 180])), ("lstm", "none", 2, "sketch", seeded(2, [190, 170])),
            ("lstm", "1gbit", 2, "dense", record(1.0, 0.0)), ("lstm", "1gbit", 2, "sketch", record(0.5, 0.0))]
    found = {t.label: t for t in times_to_target(runs, "dense")}
    assert found["dense"].reached and found["dense"].steps.center == 20  # 10 steps an epoch: the last epoch
    assert (found["sketch"].steps.low, found["sketch"].steps.high) == (10, math.inf) and not found["sketch"].reached
    assert found["sketch"].target == 175


def test_report_has_every_run_failures_included_and_plots(tmp_path):
    results = [result("lstm", "dense", rec=record(1.0, 200.0)), result("lstm", "sketch", rec=record(0.5, 210.0, spike=5.0)),
               result("lstm", "topk", status="failed"), result("lstm", "ddp", status="unavailable"),
               result("lstm", "exchange-probe", runner="exchange-probe", rec={"rows": [
                   {"label": "dense", "exchange_s": 0.4, "vs_baseline": 1.0, "bytes_sent_per_step": 1e7},
                   {"label": "sketch", "exchange_s": 0.05, "vs_baseline": 0.125, "bytes_sent_per_step": 2e6}]}),
               result("lstm", "alone", rec={**record(0.2, 300.0), "path": "local"}),
               result("lstm", "dense", rate="none", rec=record(0.2, 200.0)),
               result("lstm", "sketch", rate="none", rec=record(0.1, 198.0))]  # reaches dense's 200 at step 20
    cells = outcomes(results, "dense")
    assert cells["lstm", "1gbit", 2]["sketch"].probe_s.center == 0.05 and cells["lstm", "1gbit", 2]["topk"].step_s is None
    assert cells["lstm", "1gbit", 2]["sketch"].time_to_target_s.center == pytest.approx(20 * 0.5)  # median step
    matrix = Matrix.load(str(ROOT / "configs" / "bench.yaml")).select(workloads=["lstm"], rates=["1gbit"], ranks=[2])
    verdicts = evaluate(cells, "sketch", "dense", [("lstm", "1gbit", 2)])
    meta = {"command": "hvdsketch bench train", "started": "now", "load": [1.0, 2.0],
            "machine": {"cpu": "cpu", "nproc": 2, "memory_gib": 4.0, "host": "h"}}
    text = markdown(results, verdicts, matrix, meta)
    rows = {line.split("|")[3].strip(): line for line in text.splitlines()
            if line.startswith("| 1gbit") and line.count("|") == 19}  # the training table's
    assert " 2x |" in rows["sketch"] and "+5.0%" in rows["sketch"]  # speed-up, perplexity 5% higher
    # compute 200 - 10 ms in the hooks, codec 30, wait 250 + 10 - 30, update 50: the step's 500 ms by part
    assert [cell.strip() for cell in rows["sketch"].split("|")[8:12]] == ["190", "30", "230", "50"]
    assert rows["sketch"].split("|")[7].strip() == "2.5x" and rows["dense"].split("|")[7].strip() == "5x"  # vs alone
    assert "embedding exchange: met" in rows["sketch"]  # 0.125x
    assert "failed: exit 1: boom" in rows["topk"] and "unavailable" in rows["ddp"]
    assert "0.125x" in text  # the probe table
    assert "| 1gbit |     2 | sketch |" in text.split("Time to dense's final quality")[1]  # the time-to-target table
    written = plots(results, matrix, tmp_path)
    assert sorted(p.name for p in written) == ["lstm-breakdown.png", "lstm-bytes.png", "lstm-pareto.png",
                                               "lstm-quality.png", "lstm-step.png"]
    assert all(p.stat().st_size > 1000 for p in written)


def test_a_mean_rounded_past_its_equal_repeats_still_plots(tmp_path):
    accuracy = 0.7638  # three deterministic repeats alike; their mean rounds a hair above them
    mean = sum([accuracy] * 3) / 3
    assert mean > accuracy
    path = tmp_path / "quality.png"
    report.line_plot({"1gbit, 2 ranks": {"auto": [(1.0, mean, accuracy, accuracy), (2.0, 0.6, 0.5, 0.7)]}},
                     str(path), "quality", "wall time (s)", "accuracy", log="x")
    assert path.stat().st_size > 1000


def test_every_entry_of_a_plot_looks_different():
    labels = [f"entry{i}" for i in range(15)]  # a workload's entries: more than matplotlib's ten colours
    look = report.looks(labels + labels[:3])
    assert list(look) == labels
    for kind in ("marker", "linestyle", "hatch"):
        assert len({(look[label]["color"], str(look[label][kind])) for label in labels}) == 15


def test_resume_keeps_what_succeeded_and_everything_outside_the_selection(bench_config):
    jobs = Matrix.load(bench_config).select(workloads=["fashion"], rates=["1gbit"], ranks=[2]).jobs()
    done, broke, elsewhere = (result("fashion", jobs[0].label), result("fashion", jobs[1].label, status="failed"),
                              result("fashion", "dense", rate="10gbit"))
    others, kept = carried([done, broke, elsewhere], jobs)
    assert others == [elsewhere] and kept == {done.key: done}  # the failed run runs again
    assert carried([done, broke, elsewhere], jobs, report_only=True)[1] == {done.key: done, broke.key: broke}
    assert carried([done, broke, elsewhere], jobs, redo=True) == ([elsewhere], {})  # --redo: all again
    unshaped, probe = result("fashion", "dense", rate="none"), result("fashion", "x", runner="exchange-probe")
    matrix = Matrix.load(bench_config)
    assert ordered([unshaped, elsewhere, probe, broke, done], matrix) == [done, broke, probe, elsewhere, unshaped]


def test_the_estimate_prices_an_untimed_entry_at_its_cells_median_run(bench_config, tmp_path):
    jobs = Matrix.load(bench_config).select(workloads=["fashion"], rates=["1gbit"], ranks=[2, 4], repeats=1).jobs()
    steps = 2 * 30  # fashion: epochs x steps per epoch

    def run(label, seconds, ranks=2, status="ok"):
        return {"workload": "fashion", "rate": "1gbit", "ranks": ranks, "label": label, "status": status,
                "record": {"steps": steps}, "seconds": seconds}

    earlier = tmp_path / "bench.json"
    earlier.write_text(json.dumps({"results": [run("dense", 100), run("dense", 140), run("dense", 120),
                                               run("other", 60), run("sketch", 1, status="failed")]}))
    said = train.estimate([j for j in jobs if j.entry is not None], earlier)
    # np2: dense at its own median (120), sketch at the cell's (110, of 60, 100, 120, 140); np4: never timed
    assert said.startswith("4 runs; about 00:03:50 (h:m:s)")
    assert "1 of them at their cell's median run, 2 of them in no cell timed there" in said


def test_a_failed_run_is_explained_by_its_exception():
    log = ("Traceback (most recent call last):\n  File x\nFloatingPointError: gradient 'w' is NaN\n"
           "FloatingPointError: gradient 'w' is NaN\n-----\nmpirun detected that one or more processes exited\n")
    assert _why(log) == "FloatingPointError: gradient 'w' is NaN"
    assert _why("a\nb\nc\nd\n") == "b / c / d"
    exited = ("hvdsketch bench exchange: no entry labelled 'dense' (the baseline)\n"
              "Primary job  terminated normally, but 1 process returned\nExit code: 1\n")
    assert _why(exited) == "hvdsketch bench exchange: no entry labelled 'dense' (the baseline)"


# --- repeats, spreads and verdicts ---------------------------------------------------------------


def test_a_spread_is_the_median_and_a_ratio_spans_the_extreme_ratios():
    a, b = Spread.median([50.0, 52.0, 90.0]), Spread.median([100.0, 104.0, 110.0])
    assert (a.center, a.low, a.high, a.n) == (52.0, 50.0, 90.0, 3)
    ratio = b.over(a)  # b's repeats against a's: 2x at the medians, from 100/90 to 110/50
    assert ratio.center == pytest.approx(2.0) and ratio.low == pytest.approx(100 / 90)
    assert ratio.high == pytest.approx(2.2)
    assert a.text(3) == "52 (50..90)" and Spread.point(0.5).text(3, "x") == "0.5x"
    assert Spread.median([2.0, 3.0, math.inf]).text() == "3 (2..never)"  # a seed that never reached it
    assert Spread.median([None, None]) is None and Spread.mean([1.0, 2.0, 6.0]).center == 3.0


def test_a_ratio_of_figures_kept_by_round_spans_the_ratios_of_their_rounds():
    """The machine slows in round 2 for both entries: pair by pair B stays 1.1x A, where the extreme
    ratios would straddle 1 (and make "B slower than A" undecided)."""
    times = [100.0, 200.0, 110.0, 105.0, 120.0]
    a = Spread.by_round({(0, r): t for r, t in enumerate(times)})
    b = Spread.by_round({(0, r): 1.1 * t for r, t in enumerate(times)})
    ratio = b.over(a)
    assert (ratio.center, ratio.n) == (pytest.approx(1.1), 5)
    assert (ratio.low, ratio.high) == (pytest.approx(1.1), pytest.approx(1.1))
    assert judge(ratio, 1.0, at_most=False) == MET
    unpaired = Spread.median(1.1 * t for t in times).over(Spread.median(times))  # 110 / 200 .. 220 / 100
    assert judge(unpaired, 1.0, at_most=False) == UNDECIDED
    # a run alone in a slow mode still widens the spread
    slow = Spread.by_round({**dict(b.rounds), (0, 4): 264.0})
    assert (slow.over(a).low, slow.over(a).high) == (pytest.approx(1.1), pytest.approx(2.2))
    # fewer than PAIRED rounds in common (another command's runs are not in them): the extreme ratios
    four = Spread.by_round({**{r: v for r, v in b.rounds if r != (0, 4)}, (1, 4): 132.0})
    assert four.over(a).low == pytest.approx(110 / 200)
    assert Spread.median([1.1, 1.2]).over(Spread.median([1.0])).low == pytest.approx(1.1)


def test_step_speed_ups_pair_the_runs_of_one_round_of_one_command():
    def cell(steps, redone=None):
        """The runs of ``steps``, the ``redone`` entry's second repeat by a second command (a resume)."""
        return [dataclasses.replace(result("fashion", label, rec=record(s, 0.8), repeat=r + 1),
                                    session=int(label == redone and r == 1))
                for label, times in steps.items() for r, s in enumerate(times)]

    dense = [0.10, 0.20, 0.11, 0.10, 0.12]
    drift = {"dense": dense, "sketch": [t / 2 for t in dense]}  # 2x faster in every round
    cells = outcomes(cell(drift), "dense")["fashion", "1gbit", 2]
    assert cells["sketch"].step_s.rounds[:2] == (((0, 1), 0.05), ((0, 2), 0.10))
    ratio = cells["dense"].step_s.over(cells["sketch"].step_s)
    assert (ratio.low, ratio.high, ratio.n) == (pytest.approx(2), pytest.approx(2), 5)
    # a run of another command (a resume) is in no round of this one's: 4 pairs, too few to pair
    resumed = outcomes(cell(drift, redone="sketch"), "dense")["fashion", "1gbit", 2]
    assert resumed["dense"].step_s.over(resumed["sketch"].step_s).low == pytest.approx(0.10 / 0.10)
    plain = {k: v for k, v in dataclasses.asdict(result("fashion", "dense", rec=record(0.1, 0.8))).items()
             if k != "session"}
    assert earlier_results({"results": [plain]})[0].round == (0, 1)  # one command made them all
    assert earlier_results({"resumed": ["hvdsketch bench train"], "results": [plain]})[0].round is None
    assert earlier_results({"resumed": ["x"], "results": [{**plain, "session": 1}]})[0].round == (1, 1)


def test_exchange_probe_batches_steps_pairs_ratios_by_step_and_judges_its_subject():
    from hvdsketch.lab.bench.exchange import against_fastest, batched, ratio

    steps = [10.0, 11.0, 12.0, 13.0, 30.0, 31.0, 32.0, 33.0, 20.0]  # the machine's mood drifts in runs of steps
    spread = batched(steps, 3)  # batches of 3: medians 11, 30, 32
    assert (spread.center, spread.low, spread.high, spread.n) == (30.0, 11.0, 32.0, 3)
    slower = [1.02 * t for t in steps]  # 2% slower at every step, whatever the drift
    paired = ratio(slower, steps, 3)
    assert paired.center == pytest.approx(1.02) and paired.high - paired.low == pytest.approx(0, abs=1e-12)
    assert slower[0] / max(steps) < 1 < max(slower) / steps[0]  # the extreme ratios of the times would straddle 1
    times = {"auto": slower, "union": [2 * t for t in steps], "allgather": steps}
    assert against_fastest(times, "auto", 0.05, 3)["fastest"] == "allgather"
    assert against_fastest(times, "auto", 0.05, 3)["verdict"] == MET  # 1.02 at most 1.05 on the whole spread
    assert against_fastest(times, "auto", 0.01, 3)["verdict"] == MISSED
    noisy = {"auto": [t * r for t, r in zip(steps, [1.0, 1.0, 1.0, 1.1, 1.1, 1.1, 1.0, 1.0, 1.0])], "allgather": steps}
    assert against_fastest(noisy, "auto", 0.05, 3)["verdict"] == UNDECIDED  # a batch at 1.1x, the others at 1x
    with pytest.raises(SystemExit, match="--subject 'sketch'"):
        against_fastest(times, "sketch", 0.05, 3)


def test_verdict_rule_met_missed_or_undecided_by_the_spread_against_the_margin():
    # "A at least 5% faster than B": B's step time over A's at least 1.05
    assert judge(Spread(1.10, 1.06, 1.15, 3), 1.05, at_most=False) == MET  # even the worst ratio clears it
    assert judge(Spread(1.00, 0.97, 1.04, 3), 1.05, at_most=False) == MISSED  # even the best fails
    assert judge(Spread(1.06, 1.00, 1.12, 3), 1.05, at_most=False) == UNDECIDED  # the margin inside the spread
    assert judge(Spread(0.10, 0.08, 0.25, 3), 0.19, at_most=True) == UNDECIDED
    assert combine([MET, UNDECIDED]) == UNDECIDED and combine([MET, MISSED, UNDECIDED]) == MISSED
    assert combine([MET, MET]) == MET


def test_targets_on_overlapping_repeats_are_undecided_and_on_separated_ones_decided():
    def fashion(none_ms):
        return {("fashion", "1gbit", 4): {"dense": Outcome(Spread.median([0.050, 0.051, 0.052]), 0.8, True),
                                          "none": Outcome(Spread.median([s / 1e3 for s in none_ms]), 0.8, True)}}

    def verdict(cells):
        (found,) = [v for v in evaluate(cells, "sketch", "dense", cells) if v.target == "hvdsketch none"]
        return found

    # within 3%: none's slowest (52.5) against dense's fastest (50) is 5% slower, its fastest is faster
    assert verdict(fashion([49.0, 51.0, 52.5])).word == UNDECIDED
    assert verdict(fashion([50.0, 50.5, 51.0])).word == MET  # 51 / 50: +2% at worst
    missed = verdict(fashion([56.0, 57.0, 58.0]))  # 56 / 52: +7.7% at best
    assert missed.word == MISSED and missed.met is False and "(50..52 ms)" not in missed.measured
    assert "57 (56..58) vs 51 (50..52) ms" in missed.measured
    # a seed that never reached dense's quality makes "exact reaches dense" undecided, none reaching: missed
    some = {("lstm", "1gbit", 2): {"dense": Outcome(1.0, 100.0, False, time_to_target_s=10.0),
                                   "union": Outcome(1.0, 101.0, False,
                                                    time_to_target_s=Spread.median([8.0, 9.0, math.inf]))}}
    (reach,) = [v for v in evaluate(some, "sketch", "dense", some) if v.target == "exact reaches dense"]
    assert reach.word == UNDECIDED and "some seeds reached" in reach.measured
    del some["lstm", "1gbit", 2]["dense"]  # no baseline ran: nothing to reach
    (reach,) = [v for v in evaluate(some, "sketch", "dense", some) if v.target == "exact reaches dense"]
    assert reach.word == "not measured"


def test_repeats_of_a_seeded_workload_train_from_their_own_seeds(tmp_path):
    import yaml

    train = write(tmp_path, "w.yaml", "workload: lstm:batch_size=4,seed=5\nlr: 1.0\n")
    config = write(tmp_path, "bench.yaml", f"""\
        rates: [none]
        ranks: [2]
        repeats: 4
        workloads:
          lstm: {{config: {train}, seeds: 3}}
          plain: {{config: {train}}}
        entries: [{{label: dense, compression: none, path: horovod}}]
        """)
    seeds = {}
    for job in Matrix.load(config).jobs():
        job.command(tmp_path / job.key, [])
        flag = yaml.safe_load((tmp_path / job.key / "config.yaml").read_text())["workload"]
        seeds[job.workload.name, job.repeat] = Spec.parse(flag).options["seed"]
    assert [seeds["lstm", r] for r in (1, 2, 3, 4)] == ["5", "6", "7", "5"]  # the workload's seed, then on
    assert {seeds["plain", r] for r in (1, 2, 3, 4)} == {"5"}  # one seed: its config's, unchanged
    from hvdsketch.lab.workloads import get

    assert get("lstm:batch_size=4,seed=6").seed == 6  # hvdsketch train takes the seed from the flag


def test_unshaped_runs_of_auto_decide_for_the_shaped_link_and_join_only_its_times(tmp_path):
    """auto's decisions follow the link: its unshaped quality runs declare the cell's shaped rate,
    and their curves time at that rate only; a setting that does not probe stays as it is."""
    import yaml

    train = write(tmp_path, "w.yaml", "workload: lstm:batch_size=4\nlr: 1.0\n")
    config = write(tmp_path, "bench.yaml", f"""\
        rates: [none, 1gbit]
        ranks: [2]
        repeats: 1
        workloads:
          lstm: {{config: {train}}}
        entries: [{{label: auto, compression: "auto:warmup=2"}}, {{label: fixed, compression: "auto:bandwidth=10gbit"}},
                  {{label: sketch, compression: sketch}}]
        """)
    flags = {}
    for job in Matrix.load(config).jobs():
        if job.entry is not None:
            job.command(tmp_path / job.key, [])
            flags[job.rate, job.label] = yaml.safe_load((tmp_path / job.key / "config.yaml").read_text())["compression"]
    assert flags["none", "auto"] == "auto:bandwidth=1gbit,warmup=2" and flags["1gbit", "auto"] == "auto:warmup=2"
    assert flags["none", "fixed"] == "auto:bandwidth=10gbit" and flags["none", "sketch"] == "sketch"
    alone = [job for job in Matrix.load(config).select(rates=["none"]).jobs() if job.label == "auto"]
    alone[0].command(tmp_path / "alone", [])  # the unshaped cell run by itself (--rates none): the same link
    assert yaml.safe_load((tmp_path / "alone" / "config.yaml").read_text())["compression"] == flags["none", "auto"]

    def run(label, rate, compression):
        return ("lstm", rate, 2, label, {**record(0.1, 200.0), "config": {"compression": compression}})

    runs = [run("dense", "none", "none"), run("dense", "1gbit", "none"), run("dense", "10gbit", "none"),
            run("auto", "none", flags["none", "auto"]), run("auto", "1gbit", "auto:warmup=2"),
            run("auto", "10gbit", "auto:warmup=2")]
    assert {(t.label, t.rate) for t in times_to_target(runs, "dense")} == {
        ("dense", "1gbit"), ("dense", "10gbit"), ("auto", "1gbit")}


def test_the_probe_times_its_baseline_when_the_entries_leave_it_out(bench_config, tmp_path):
    import yaml

    matrix = Matrix.load(bench_config).select(workloads=["fashion"], entries=["sketch"], rates=["1gbit"], ranks=[2],
                                              repeats=1)
    assert [j.key for j in matrix.jobs()] == ["fashion-1gbit-np2-sketch-r1", "fashion-1gbit-np2-exchange-probe-r1"]
    assert [e.label for e in matrix.probe_entries("fashion")] == ["dense", "sketch"]  # dense probed, not trained
    command = matrix.jobs()[1].command(tmp_path, matrix.probe_entries("fashion"), matrix.baseline)
    assert command[command.index("--baseline") + 1] == "dense"
    assert [e["label"] for e in yaml.safe_load((tmp_path / "entries.yaml").read_text())] == ["dense", "sketch"]
    assert "leaves out dense; each probe times dense too" in probe_notice(matrix, matrix.jobs())
    assert probe_problem(matrix, "fashion") is None
    lacking = dataclasses.replace(Matrix.load(bench_config), baseline="nope").select(repeats=1)
    assert "needs its baseline" in probe_problem(lacking, "fashion")
    assert "no entry labelled 'nope'" in probe_notice(lacking, lacking.jobs())


def test_report_only_shows_spreads_marks_an_outlying_repeat_and_resumes_by_repeat(bench_config, tmp_path, capsys):
    """A fake bench.json of 3 repeats (one of sketch's runs in the slow mode), rebuilt by --report-only."""
    out = tmp_path / "out"
    out.mkdir()
    steps = {"dense": [1.0, 1.02, 0.98], "sketch": [0.5, 0.9, 0.51]}
    results = [result("fashion", label, rec=record(s, 0.8, metric="accuracy"), repeat=r + 1)
               for label, times in steps.items() for r, s in enumerate(times)]
    results[4].machine_state = {"samples": 3, "runnable": [2, 5, 9], "ranks": [
        {"pid": 1, "affinity": [0, 1], "threads": 12, "cpus": [0], "nonvoluntary_switches": 4000}]}
    meta = {"command": "hvdsketch bench train", "started": "now", "load": [1.0, 2.0],
            "machine": {"cpu": "cpu", "nproc": 2, "memory_gib": 4.0, "host": "h"}}
    (out / "bench.json").write_text(json.dumps({**meta, "results": [dataclasses.asdict(r) for r in results]}))
    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    args = parser.parse_args(["--config", bench_config, "--workloads", "fashion", "--entries", "dense,sketch",
                              "--rates", "1gbit", "--ranks", "2", "--out", str(out), "--report-only"])
    assert train.run(args) == 0
    text = (out / "bench.md").read_text()
    rows = {line.split("|")[3].strip(): line for line in text.splitlines() if line.startswith("| 1gbit")}
    assert "| 3 ok |" in rows["sketch"] and " 510 (500..900) |" in rows["sketch"]  # median (min..max), ms
    assert "1.96x (1.09..2.04)" in rows["sketch"]  # 1000/510; 3 rounds, too few to pair: 980/900, 1020/500
    assert "| 500 900! 510 " in rows["sketch"] and "| 1000 1020 980 " in rows["dense"]
    assert "`fashion-1gbit-np2-sketch-r2`: 900 ms a step" in text and "4000 preemptions" in text
    assert "median over the repeats (min..max)" in text
    assert sorted(p.name for p in out.glob("*.png")) == ["fashion-breakdown.png", "fashion-bytes.png", "fashion-step.png"]
    saved = json.loads((out / "bench.json").read_text())
    assert [r["key"] for r in saved["results"]][:3] == [f"fashion-1gbit-np2-dense-r{r}" for r in (1, 2, 3)]
    # --resume with --repeats 2 keeps repeats 1 and 2 for the jobs and repeat 3 as a result outside them
    jobs = Matrix.load(bench_config).select(workloads=["fashion"], entries=["dense"], rates=["1gbit"], ranks=[2],
                                            repeats=2).jobs()
    others, kept = carried(results, jobs)
    assert sorted(kept) == ["fashion-1gbit-np2-dense-r1", "fashion-1gbit-np2-dense-r2"]
    assert "fashion-1gbit-np2-dense-r3" in [r.key for r in others]
    # --redo: none of the entry's earlier runs stays, repeat 3 and a key from before repeats neither
    unrepeated = dataclasses.replace(results[0], key="fashion-1gbit-np2-dense")
    others, kept = carried(results + [unrepeated], jobs, redo=True)
    assert kept == {} and sorted({r.label for r in others}) == ["sketch"]  # another entry's runs stay


def test_the_watch_finds_a_runs_processes_and_reads_their_cpus(tmp_path):
    run_dir = tmp_path / "runs" / "x-r1"
    run_dir.mkdir(parents=True)
    code = "import threading, time; threading.Thread(target=time.sleep, args=(30,)).start(); time.sleep(30)"
    other = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "runs" / "x-r10" / "config.yaml")])
    mine = subprocess.Popen([sys.executable, "-c", code, str(run_dir / "config.yaml")])
    try:
        time.sleep(1.0)
        assert watch.rank_pids(str(run_dir)) == [mine.pid]  # not x-r10's
        w = watch.Watch(run_dir)
        w.sample()
        w.sample()
        summary = w.summary()
        (rank,) = summary["ranks"]
        assert rank["pid"] == mine.pid and rank["threads"] >= 2
        assert set(rank["cpus"]) <= set(rank["affinity"]) == os.sched_getaffinity(mine.pid)
        assert summary["samples"] == 2 and 1 <= summary["runnable"][0] <= summary["runnable"][2]
    finally:
        for proc in (mine, other):
            proc.kill()
            proc.wait()


# --- the scaling model ----------------------------------------------------------------------------


def test_union_growth_and_winners():
    supports = [np.array([0, 1]), np.array([1, 2]), np.array([5]), np.array([5, 6])]
    mean, groups = scaling.union_growth(supports, [1, 2, 4, 8], max_groups=10)
    assert mean == {1: 1.75, 2: 2.5, 4: 5.0} and groups == {1: 4, 2: 2, 4: 1}  # 3 and 2 rows, then 5
    s = scaling.Supports("w", "t", rows=1000, width=8, batch_size=1, per_batch=[10, 10], union={2: 20.0, 4: 40.0},
                         groups={2: 1, 4: 1})
    points = scaling.model(s, error=0.5, sketch_rows=1, wire=4, latency=1e-3, bandwidth=1e6)
    by = {(p.ranks, p.algorithm): p for p in points}
    assert by[2, "dense"].bytes_per_rank == 1000 * 8 * 4 and by[2, "horovod-sparse"].bytes_per_rank == 10 * (8 + 32)
    assert by[2, "allgather"].bytes_per_rank == 32 + 10 * (4 + 32)  # coalesced rows, int32 indices, two headers
    assert by[4, "union"].bytes_per_rank == 1.5 * (125 + 40 * 8 * 4)
    assert by[4, "sketch"].bytes_per_rank == scaling.sketch_bytes(4, 1000, scaling.planned_bound(40.0, 1000), 8, 0.5)
    assert scaling.planned_bound(40.0, 1000) >= 44  # the union seen last, with headroom
    assert by[4, "sparcml"].bytes_per_rank == 2 * 24 + (10 + 20) * 8 * 12  # rounds over 1, then 2 ranks' rows
    assert by[4, "union"].seconds == pytest.approx(2 * 6 * 1e-3 + by[4, "union"].bytes_per_rank / 1e6)  # no codec
    assert scaling.winners(points, scaling.EXACT)[0] == (2, 4, "allgather")


def test_a_sketch_no_smaller_than_the_tensor_is_sent_dense():
    assert scaling.sketch_bytes(4, 100, 100, 8, error=0.5) == scaling.dense_bytes(4, 100, 8)
    assert scaling.sketch_bytes(4, 100, 10, 8, error=0.5) < scaling.dense_bytes(4, 100, 8)


MPI_SCRIPT = """
import json
import numpy as np
import torch
from hvdsketch.lab.bench import scaling
from hvdsketch.collectives.mpi import MPICommunicator
from hvdsketch.collectives.sparse import SparseVector, isparcml_allreduce
from hvdsketch.compress import RowSparse, TensorContext, create, rowcode
from hvdsketch.exchange import Exchanger
from hvdsketch.ops import numpy as np_ops
from hvdsketch.policy import Fixed

R, W = 1001, 6
comm = MPICommunicator()
rng = np.random.default_rng(comm.rank)
k = 40 + 7 * comm.rank
rows = np.sort(rng.choice(R, k, replace=False))
g = RowSparse(torch.from_numpy(rows), torch.from_numpy(rng.standard_normal((k, W)).astype(np.float32) + 3), (R, W))
sent = {}
for flag in ("none", "allgather", "union", "balanced", "sketch:density=0.25"):
    exchanger = Exchanger(Fixed(create(flag)), comm)
    exchanger.exchange({"emb": g})  # the sketch sized from density: 0.25 R rows
    before = sum(c["bytes_sent"] for c in comm.stats.snapshot().values())
    comm.stats.reset()
    sent[flag] = before
union = int(np.unique(np.concatenate(comm.comm.allgather(rows))).size)
dense = g.to_dense().numpy().reshape(-1)
isparcml_allreduce(comm, SparseVector.from_dense(dense)).wait()
sent["sparcml"] = comm.stats.snapshot()["sparcml"]["bytes_sent"]
code = int(rowcode.encode(np_ops, rows.astype(np.int64), R)[1].size)
counts = comm.comm.gather((sent, k, union, comm.comm.allgather(rows.tolist()), code), root=0)
if comm.rank == 0:
    print("RESULT " + json.dumps(counts))
"""


@pytest.mark.skipif(not shutil.which("mpirun"), reason="needs Open MPI")
def test_byte_formulas_match_the_mpi_counters(tmp_path):
    """The model's formulas are the bytes hvdsketch's compressors send over its MPI layer (the mean over
    ranks; the step tag's few bytes aside)."""
    script = tmp_path / "counts.py"
    script.write_text(MPI_SCRIPT)
    n = 4
    cmd = ["mpirun", "--bind-to", "none", "--oversubscribe", "-np", str(n), sys.executable, str(script)]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
    done = launched(cmd, timeout=200, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    counts = json.loads(done.stdout.split("RESULT ", 1)[1])
    sent = {label: np.mean([c[0][label] for c in counts]) for label in counts[0][0]}
    k, union = np.mean([c[1] for c in counts]), counts[0][2]
    tag = 2 * (n - 1) / n * 48  # the exchanger's step check: six int64 riding every step
    assert sent["none"] - tag == pytest.approx(scaling.dense_bytes(n, 1001, 6))
    assert sent["allgather"] - tag == pytest.approx(scaling.allgather_bytes(n, k, 6))
    assert sent["union"] - tag == pytest.approx(scaling.union_bytes(n, 1001, union, 6))
    code = np.mean([c[4] for c in counts])  # each rank's rows as deltas or bitmap, whichever is smaller
    assert sent["balanced"] - tag == pytest.approx(scaling.balanced_bytes(n, 1001, k, union, 6, code=code))
    assert sent["balanced"] - tag < 1.1 * scaling.bound_bytes(n, 1001, k, union, 6)
    assert sent["sketch:density=0.25"] - tag == pytest.approx(scaling.sketch_bytes(n, 1001, 251, 6, 0.5))
    rows = [set(r) for r in counts[0][3]]  # recursive doubling: round 0 each rank's rows, round 1 a pair's
    pair = np.mean([len(rows[0] | rows[1]), len(rows[2] | rows[3])])
    assert sent["sparcml"] == pytest.approx(scaling.sparcml_bytes(n, 1001, 6, {1: k, 2: pair}.__getitem__))


# --- one tiny real run ----------------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("tc"), reason="cluster.sh needs root, ip and tc")
@needs.horovod
def test_bench_train_runs_a_tiny_matrix_on_the_cluster(tmp_path):
    config = write(tmp_path, "bench.yaml", f"""\
        rates: [1gbit]
        ranks: [2]
        timeout_s: 200
        repeats: 1
        workloads:
          fashion: {{config: {ROOT / 'configs' / 'fashion.yaml'}, epochs: 1, steps_per_epoch: 3}}
          lstm_tf: {{config: {ROOT / 'configs' / 'lstm_tf.yaml'}, epochs: 1, steps_per_epoch: 2,
                    workload: "lstm_tf:batch_size=4,bptt=10,vocab_size=2000,embed_dim=16,hidden=16,val_limit=8"}}
        entries:
          - {{label: dense, compression: none, path: horovod}}
          - {{label: none, compression: none, workloads: [fashion]}}
          - {{label: dropin-sketch, compression: sketch, path: horovod, workloads: [lstm_tf]}}
          - {{label: sketch, compression: sketch, workloads: [lstm_tf]}}
          - {{label: ddp, runner: hvdsketch.lab.bench.no_such_module, workloads: [fashion]}}
        """)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "hvdsketch.lab.cli", "bench", "train", "--config", config,
                           "--out", str(out)], capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[1/6 " in done.stdout and "[6/6 " in done.stdout  # progress
    bench = json.loads((out / "bench.json").read_text())
    status = {(r["workload"], r["label"]): r["status"] for r in bench["results"]}
    assert status == {("fashion", "dense"): "ok", ("fashion", "none"): "ok", ("fashion", "ddp"): "unavailable",
                      ("lstm_tf", "dense"): "ok", ("lstm_tf", "dropin-sketch"): "ok", ("lstm_tf", "sketch"): "ok"
                      }, bench["results"]
    records = {(r["workload"], r["label"]): r["record"] for r in bench["results"] if r["status"] == "ok"}
    assert records["fashion", "none"]["steps"] == 3 and records["fashion", "none"]["bytes_sent_per_step"] > 0
    # the TF tape's sketch runs in Python ops inside tf.function: its bytes are counted as it runs
    tape, dense = records["lstm_tf", "sketch"], records["lstm_tf", "dense"]
    assert 0 < tape["bytes_sent_per_step"] < dense["bytes_sent_per_step"]
    fallback = next(t for t in bench["targets"] if t["target"] == "hvdsketch none")
    assert fallback["word"] in ("met", "MISSED", "undecided")  # measured, whichever way it went
    assert all(r["machine_state"]["samples"] > 0 for r in bench["results"] if r["status"] == "ok")
    assert "| 1gbit" in (out / "bench.md").read_text() and (out / "fashion-step.png").exists()


# --- where a step's time goes ----------------------------------------------------------------------


@pytest.mark.parametrize("timing, phases, expected", [
    # hvdsketch's optimizer: 10 ms of backward in the hooks (start), codec 30 ms within start and finish
    ({"backward": 0.2, "exchange": 0.25, "update": 0.05}, {"start": 0.01, "finish": 0.25, "codec": 0.03},
     {"compute": 0.19, "codec": 0.03, "wait": 0.23, "update": 0.05}),
    # Horovod's own optimizer: no phases, its synchronize() all wait, the codec not timed apart
    ({"backward": 0.2, "exchange": 0.25, "update": 0.05}, {}, {"compute": 0.2, "codec": None, "wait": 0.25,
                                                              "update": 0.05}),
    # hvdsketch's DDP hook: start and finish inside backward (the last bucket finishes the step)
    ({"backward": 0.5, "update": 0.05}, {"start": 0.02, "finish": 0.2, "codec": 0.04},
     {"compute": 0.28, "codec": 0.04, "wait": 0.18, "update": 0.05}),
    # DDP's own allreduce or PowerSGD hook: the exchange is inside backward, unseen
    ({"backward": 0.5, "update": 0.05}, {}, None),
    # the TensorFlow loop: one tf.function, no timing of its parts
    (None, None, None),
])
def test_a_step_breaks_down_into_compute_codec_wait_and_update(timing, phases, expected):
    from hvdsketch.lab import breakdown

    parts = breakdown.of({"timing_s": timing and {**timing, **phases}})
    if expected is None:
        assert parts is None
        return
    assert parts == pytest.approx(expected)
    assert sum(parts[p] or 0.0 for p in breakdown.PARTS) == pytest.approx(sum(timing.values()))



@needs.horovod  # hvdsketch train
@pytest.mark.timeout(600)
@pytest.mark.parametrize("path, flag", [("local", "none"), ("hvdsketch", "allgather")])
def test_a_training_record_breaks_its_step_down(tmp_path, path, flag):
    """``hvdsketch train`` at 2 ranks: the parts of the record's median step add up to it (the loop's
    own few microseconds aside); ``path: local`` (each rank alone, the limit) sends nothing and waits
    for nothing, ``path: hvdsketch`` spends time in the codec."""
    from hvdsketch.lab import breakdown

    cmd = ["mpirun", "--bind-to", "none", "-np", "2", sys.executable, "-m", "hvdsketch.lab.cli", "train",
           "--config", "configs/fasttext.yaml", "--compression", flag, "--path", path, "--steps-per-epoch", "8",
           "--out", str(tmp_path)]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    done = launched(cmd, cwd=ROOT, timeout=540,
                          env=clean_env(PYTHONPATH=str(ROOT), OMPI_MCA_rmaps_base_oversubscribe="1"))
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    (record,) = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    parts = breakdown.of(record)
    total = sum(seconds or 0.0 for seconds in parts.values())
    median = sorted(record["steps_s"])[len(record["steps_s"]) // 2]
    assert 0.9 * median <= total <= median + 1e-5  # steps_s are rounded to 10 us
    assert "(compute " in done.stdout and " ms)" in done.stdout  # the summary's line
    if path == "local":
        assert record["bytes_sent_per_step"] == 0 and parts["wait"] < 1e-3 and parts["codec"] is None
    else:
        assert record["bytes_sent_per_step"] > 0 and parts["codec"] > 0 and parts["wait"] > 0


def test_every_benchmark_says_which_allocator_settings_it_ran_with(monkeypatch):
    from hvdsketch.lab.bench.report import allocator

    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    assert allocator() == "glibc's defaults"
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "2000000000")
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1000000000")
    assert allocator() == "MALLOC_MMAP_THRESHOLD_=1000000000, MALLOC_TRIM_THRESHOLD_=2000000000"
