"""Bad input in one process: flags, keyword options, training configs; and the MPI cases whose outcome
is a hang or a stall report, run as child jobs (tests/bad_input_jobs.py) under a timeout."""
import os
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

def job(name: str, limit: float, **env: str) -> subprocess.CompletedProcess:
    """``mpirun -np 2 python -m tests.bad_input_jobs NAME`` (stdout and stderr together in ``stdout``);
    a timeout ends the job and fails the test as a hang."""
    cmd = ["mpirun", "--bind-to", "none", "-np", "2", sys.executable, "-m", "tests.bad_input_jobs", name]
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
    assert "rank 1 has waited 2 s at step 1 for" in output, output[-3000:]
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
