"""Bad input in one process: flags, keyword options, training configs; and the MPI cases whose outcome
is a hang or a stall report, run as child jobs (tests/bad_input_jobs.py) under a timeout."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hvdsketch import memory, policy, spec
from hvdsketch.compress import create
from hvdsketch.dropin import CompressionNamespace as Compression
from hvdsketch.lab.config import TrainConfig
from hvdsketch.spec import SpecError
from tests.spawn import clean_env

ROOT = Path(__file__).resolve().parents[2]


# -- flags and keyword options ---------------------------------------------------------------------

@pytest.mark.parametrize("options, message", [
    ({"rows": 2.5}, r"sketch:rows takes an int, got 2.5 \(float\)"),
    ({"rows": True}, "sketch:rows takes an int, got True"),
    ({"error": "abc"}, "sketch:error: 'abc' is not a valid float"),
    ({"error": float("inf")}, "sketch:error: inf is not a finite number"),
    ({"density": [0.1]}, r"sketch:density takes a float or none, got \[0.1\]"),
])
def test_keyword_options_are_checked_by_type(options, message):
    with pytest.raises(SpecError, match=message):
        Compression.sketch(**options)


def test_keyword_options_take_text_and_ints_where_they_convert():
    assert create("sketch", rows="3", error=1).rows == 3
    assert create("sketch", error=1).error == 1.0 and isinstance(create("sketch", error=1).error, float)


@pytest.mark.parametrize("flag, message", [
    ("sketch:error=inf", "inf is not a finite number"),
    ("sketch:error=nan", "nan is not a finite number"),
    ("fp16:dtype=bfloat16", "Horovod 0.28.1 has no bfloat16 allreduce"),
    ("topk:ratio=0", r"ratio must be in \(0, 1\]"),
])
def test_out_of_range_options_are_errors(flag, message):
    with pytest.raises(SpecError, match=message):
        create(flag)


def test_sketch_density_zero_is_an_error():
    with pytest.raises(SpecError, match="density"):
        create("sketch:density=0")


@pytest.mark.parametrize("flag", ["", "  "])
def test_an_empty_compression_is_an_error_not_none(flag, monkeypatch):
    monkeypatch.delenv(spec.ENV_VAR, raising=False)
    with pytest.raises(SpecError, match="is empty"):
        policy.create(flag)
    with pytest.raises(SpecError, match="--compression .* is empty"):
        spec.resolve(None, flag)
    with pytest.raises(SpecError, match="'compression' in the config is empty"):
        spec.resolve(None, None, {"compression": flag})


def test_an_empty_environment_variable_counts_as_unset(monkeypatch):
    monkeypatch.setenv(spec.ENV_VAR, "")
    assert spec.resolve(None, None, None) == "none"


@pytest.mark.parametrize("flag, message", [
    ("", "residual memory flag must be a non-empty string naming one of bf16, fp16, fp32"),
    ("sketchy", "unknown residual memory 'sketchy'"),
    (0.5, "memory must be a --memory flag"),
])
def test_memory_errors_name_memory_flags(flag, message):
    with pytest.raises(SpecError, match=message) as caught:
        memory.create(flag)
    assert "compression" not in str(caught.value)


def test_a_store_is_a_memory_for_every_tensor():
    assert str(memory.create(memory.Fp16())) == "fp16"


def test_a_dropin_compression_given_to_hvdsketch_means_its_compressor():
    """A script moving from Horovod's optimizer keeps its compression= argument as it is."""
    assert str(policy.create(Compression.from_spec("randomk:ratio=0.1"))) == "randomk:ratio=0.1"


def test_dropin_auto_says_where_auto_works():
    with pytest.raises((SpecError, ValueError), match="auto.*(DistributedOptimizer|DistributedGradientTape)"):
        Compression.from_spec("auto")


# -- hvdsketch train's config ---------------------------------------------------------------------

def config(tmp_path, text: str, **overrides) -> TrainConfig:
    path = tmp_path / "c.yaml"
    path.write_text("workload: lstm\n" + text)
    return TrainConfig.load(str(path), **overrides)


@pytest.mark.parametrize("text, message", [
    ("clip: -1\n", r"clip must be > 0"),
    ("clip: .inf\n", "clip.*not a finite number"),
    ("optimizer: lbfgs\n", "'lbfgs' is not one of sgd, adam"),
    ("path: ddp\n", "'ddp' is not one of hvdsketch, horovod"),
    ("steps_per_epoch: -3\n", "steps_per_epoch must be >= 1"),
    ("epochs: 0\n", "epochs must be >= 1"),
    ("epochs: three\n", "'three' is not a valid int"),
    ("epochs: 2.5\n", "config key 'epochs' takes an int"),
    ("lr: abc\n", "'abc' is not a valid float"),
    ("lr: 0\n", "lr must be > 0"),
    ("momentum: 1.5\n", r"momentum must be in \[0, 1\)"),
    ("optimizer: adam\nmomentum: 0.9\n", "momentum applies to optimizer sgd only"),
    ("sparse_as_dense: maybe\n", "'maybe' is not a valid bool"),
    ("path: horovod\nmemory: fp32\n", "memory needs path hvdsketch"),
    ("path: horovod\ncompression: {rules: [], default: none}\n", "not per-tensor rules"),
    ("path: horovod\ncompression: auto\n", "auto chooses per tensor and needs path hvdsketch"),
    ("path: horovod\ncompression: powersgd\n", "needs more than one averaged allreduce.*use path hvdsketch"),
    ("compression: sketchy\n", "unknown compressor 'sketchy'"),
    ("compression: ''\n", "'compression' in the config is empty"),
    ("memory: plan\n", "budget"),
    ("path: local\ncompression: sketch\n", "path local exchanges nothing, so it takes compression none"),
    ("path: local\nmemory: fp32\n", "path local exchanges nothing.*memory 'fp32'"),
])
def test_every_config_key_is_checked(tmp_path, monkeypatch, text, message):
    monkeypatch.delenv(spec.ENV_VAR, raising=False)
    with pytest.raises(SpecError, match=message):
        config(tmp_path, text)


def test_config_overrides_are_checked_too(tmp_path, monkeypatch):
    monkeypatch.delenv(spec.ENV_VAR, raising=False)
    with pytest.raises(SpecError, match="residual memory flag must be a non-empty string"):
        config(tmp_path, "", memory="")
    with pytest.raises(SpecError, match="memory needs path hvdsketch"):
        config(tmp_path, "memory: fp32\n", path="horovod")


def test_yaml_text_for_numbers_converts(tmp_path, monkeypatch):
    monkeypatch.delenv(spec.ENV_VAR, raising=False)
    made = config(tmp_path, "lr: 1e-3\nclip: 1\n")  # PyYAML reads 1e-3 as text
    assert made.lr == 0.001 and made.clip == 1.0
    assert config(tmp_path, "").densify is False and config(tmp_path, "path: horovod\n").densify is True


# -- MPI cases whose outcome is a hang or a stall report: child jobs ---------------------------------

def job(name: str, limit: float, extra: tuple[str, ...] = (), **env: str) -> subprocess.CompletedProcess:
    """``mpirun -np 2 python -m tests.bad_input_jobs NAME [EXTRA...]`` (stdout and stderr together in
    ``stdout``); a timeout ends the job and fails the test as a hang. Every job runs Horovod."""
    pytest.importorskip("horovod")
    cmd = ["mpirun", "--bind-to", "none", "-np", "2", sys.executable, "-m", "tests.bad_input_jobs", name, *extra]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    environment = clean_env(PYTHONPATH=str(ROOT), TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3",
                            PYTHONUNBUFFERED="1", OMPI_MCA_rmaps_base_oversubscribe="1", **env)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                          env=environment) as child:
        try:
            output, _ = child.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            child.terminate()  # mpirun passes SIGTERM on to its ranks and ends them
            try:
                output, _ = child.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                child.kill()
                output, _ = child.communicate()
            raise AssertionError(f"job {name} hung for {limit:.0f} s; its output:\n{output[-2000:]}") from None
    return subprocess.CompletedProcess(cmd, child.returncode, output, "")


def test_a_stalled_exchange_is_reported_with_what_it_waits_for():
    done = job("stall", 120, HVDSKETCH_STALL_SECONDS="2")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    waits = [int(s) for s in re.findall(r"rank 1 has waited (\d+) s at step 1 for", output)]
    assert waits and 2 <= waits[0] <= 3, output[-3000:]  # the first report after 2 s, not 5 s late
    assert waits == sorted(set(waits)), waits
    assert "another rank may not have started the same exchanges" in output
    assert "rank 0 has waited" not in output  # rank 0 was late, never waiting
    assert "rank 0: done" in output and "rank 1: done" in output


def test_dropin_compressions_that_differ_by_rank_fail_on_every_rank():
    done = job("tf_dropin_mixed", 75)
    output = done.stdout + done.stderr
    assert "rank 0: raised" in output and "rank 1: raised" in output, output[-3000:]
    assert "Mismatched data types" in output, output[-3000:]


def test_a_rank_that_retraces_alone_with_a_policy_object_does_not_hang():
    done = job("tf_retrace_policy", 75)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "rank 0: done" in output and "rank 1: done" in output, output[-3000:]


# -- ranks that differ in their model, in what takes part, or in their config ------------------------

def outcomes(output: str) -> dict[int, str]:
    """Each rank's ``rank R: ...`` outcome line of an :func:`tests.bad_input_jobs.outcome`."""
    lines = {}
    for line in output.splitlines():
        for rank in (0, 1):
            if f"rank {rank}: raised" in line or f"rank {rank}: done" in line:
                lines[rank] = line[line.index(f"rank {rank}:"):]
    return lines


def seconds(line: str) -> float:
    return float(line.split(" in ", 1)[1].split(" s", 1)[0])


@pytest.mark.parametrize("name, expected", [
    ("torch_half", "tensor 'weight' is float32 (8, 16) on rank 0 but float16 (8, 16) on rank 1"),
    ("torch_double", "tensor 'weight' is float32 (8, 16) on rank 0 but float64 (8, 16) on rank 1"),
    ("tf_dtype", "tensor 'w' is float32 (8, 4) on rank 0 but float64 (8, 4) on rank 1"),
])
def test_a_model_in_another_dtype_on_one_rank_fails_on_every_rank_within_30_s(name, expected):
    """Rank 1's model in float16 or float64 (PyTorch's optimizer; TensorFlow's tape inside
    tf.function): the start-up agreement compares dtypes and names the tensor and both."""
    done = job(name, 150)
    lines = outcomes(done.stdout)
    assert set(lines) == {0, 1}, done.stdout[-3000:]
    for rank, line in lines.items():
        assert "AgreementError" in line and expected in line, line
        assert seconds(line) < 30, line


def test_a_parameter_frozen_on_one_rank_fails_on_every_rank():
    """``requires_grad=False`` on rank 1 alone (when the optimizer is made): rank 0 would wait for a
    gradient rank 1 never exchanges; the start-up agreement says so on every rank."""
    done = job("torch_frozen", 120)
    lines = outcomes(done.stdout)
    assert set(lines) == {0, 1}, done.stdout[-3000:]
    for line in lines.values():
        assert ("AgreementError" in line and "tensor 'bias' is float32 (8,) on rank 0 but float32 (8,), left out "
                "(requires_grad=False when the optimizer was made) on rank 1") in line, line


@pytest.mark.parametrize("name", ["tf_no_gradient_eager", "tf_no_gradient_graph"])
def test_a_tf_variable_without_a_gradient_on_one_rank_takes_part_with_zeros(name):
    """Eagerly and inside ``tf.function``, ``b`` without a gradient on rank 1: every rank gets the
    average of rank 0's gradient (2 in each of 4 entries) and rank 1's zeros; ``w`` (2 in each of 32
    entries) as usual. (Inside ``tf.function``, constant zeros hung both ranks.)"""
    done = job(name, 150)
    lines = outcomes(done.stdout)
    assert set(lines) == {0, 1}, done.stdout[-3000:]
    for line in lines.values():
        assert line.endswith("[64.0, 4.0]"), line


def test_a_stall_ends_the_job_at_horovods_stall_shutdown_limit():
    """Rank 1 never comes to step 1: rank 0 reports its wait every 2 s and ends the job at
    ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` (rank 1 would sleep 300 s)."""
    done = job("torch_never_comes", 150, HVDSKETCH_STALL_SECONDS="2", HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="6")
    assert done.returncode != 0, done.stdout[-3000:]
    assert "rank 0 has waited 2 s at step 1" in done.stdout, done.stdout[-3000:]
    assert "ending this rank after the stall limit HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=6" in done.stdout
    assert "rank 1: done" not in done.stdout


def test_a_tf_variable_without_a_gradient_on_one_rank_through_horovods_tape_is_named_and_ends():
    """Horovod's own tape with the drop-in ``Compression.fp16``, ``b`` without a gradient on rank 1:
    Horovod drops the ``None`` before any compression sees it, so the case is Horovod's (with its own
    ``Compression.none`` alike). Its stall inspector names what rank 1 misses every
    ``HOROVOD_STALL_CHECK_TIME_SECONDS``; rank 1 is not stalled (its other allreduces complete, so
    ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` never fires) and runs to its end, which shuts Horovod down:
    rank 0 raises then, no hang. hvdsketch's tape takes ``b`` with zeros instead (above)."""
    done = job("tf_dropin_no_gradient", 150, HOROVOD_STALL_CHECK_TIME_SECONDS="3",
               HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="8")
    assert "Missing ranks:\n1: [" in done.stdout and "HorovodAllreduce" in done.stdout, done.stdout[-3000:]
    lines = outcomes(done.stdout)
    assert set(lines) == {0, 1}, done.stdout[-3000:]
    assert lines[1].startswith("rank 1: done") and lines[1].endswith("80 steps"), lines[1]
    assert "raised" in lines[0] and "Horovod has been shut down" in lines[0], lines[0]


@pytest.mark.parametrize("rank0, rank1, key, values", [
    ("path: hvdsketch", "path: horovod", "path", ("hvdsketch", "horovod")),
    ("lr: 0.1", "lr: 0.2", "lr", ("0.1", "0.2")),
    ("optimizer: sgd", "optimizer: adam", "optimizer", ("sgd", "adam")),
    ("clip: 0.25", "clip: 1", "clip", ("0.25", "1.0")),
])
def test_train_with_another_config_on_each_rank_fails_on_every_rank(rank0, rank1, key, values):
    """``hvdsketch train`` with a YAML of its own on each rank: the resolved configs are compared
    (one Horovod allgather_object) before any model or optimizer is made, path horovod too."""
    done = job("train_differs", 240, extra=(rank0, rank1, "lstm:batch_size=4,bptt=8,vocab_size=200"))
    lines = outcomes(done.stdout)
    assert set(lines) == {0, 1}, done.stdout[-3000:]
    expected = f"config key '{key}' is {values[0]} on rank 0 but {values[1]} on rank 1"
    for line in lines.values():
        assert "SpecError" in line and expected in line, line
