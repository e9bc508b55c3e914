"""Plain Horovod scripts (PyTorch; TensorFlow 2 eagerly and inside tf.function; tf-keras model.fit),
with hvdsketch's compression as their one change, train under horovodrun with every drop-in
compressor: each launch trains once per compressor (and mode), so the suite pays the start of
Horovod and the frameworks three times, not once per combination."""
import re
import sys
from pathlib import Path

import pytest

from tests import needs
from tests.spawn import clean_env, launched

pytestmark = needs.horovod
ROOT = Path(__file__).resolve().parents[2]
#: Every drop-in compressor (tests/unit/test_dropin_namespace.py checks the list), the sketch with
#: its drop-in sizing, random-k with a ratio that trains in a few steps.
FLAGS = ["none", "fp16", "sketch", "randomk:ratio=0.5"]
SUMMARY = re.compile(r"^(?:\[1,0\]<stdout>:)?(\S+?)(?: \((\w+)\))?: loss ([\d.]+) -> ([\d.]+); sent ([\d.]+) MB "
                     r"for ([\d.]+) MB", re.MULTILINE)
#: (script, mode) whose compression meets the dense layers only (the embedding's tf.IndexedSlices go by
#: Horovod's allgather): the drop-in sketch sends them dense, as any traced gradient whose rows all carry values.
DENSE_ONLY = {("tensorflow_horovod.py", "eager"), ("keras_horovod.py", "keras")}
SCRIPTS = {
    "pytorch_horovod.py": ([], [None], "pytorch-*.pt"),
    "tensorflow_horovod.py": (["--mode", "eager", "function"], ["eager", "function"], "tensorflow-*.index"),
    "keras_horovod.py": (["--steps", "30"], ["keras"], "keras-*.weights.h5"),
}


@pytest.mark.parametrize("script", SCRIPTS)
def test_dropin_script_trains_under_horovodrun_with_every_dropin_compressor(script, tmp_path):
    extra, modes, checkpoints = SCRIPTS[script]
    cmd = ["horovodrun", "-np", "2", "-H", "localhost:2", sys.executable, str(ROOT / "examples" / script),
           "--steps", "20", *extra, "--checkpoint-dir", str(tmp_path), "--compression", *FLAGS]
    done = launched(cmd, timeout=600, cwd=tmp_path,
                          env=clean_env(TF_CPP_MIN_LOG_LEVEL="3"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = {(flag, mode): tuple(map(float, numbers)) for flag, mode, *numbers in SUMMARY.findall(done.stdout)}
    assert set(runs) == {(flag, mode or "") for flag in FLAGS for mode in modes}, done.stdout[-3000:]
    for (flag, mode), (first, last, sent, dense) in runs.items():
        assert last < first, (flag, mode)  # it trains
        if flag == "none" or (flag == "sketch" and (script, mode) in DENSE_ONLY):
            assert dense <= sent <= dense * 1.01, (flag, mode)  # dense, and the few tags that check the ranks agree
        else:
            assert 0 < sent <= dense * 0.55, (flag, mode)  # it sends less
    assert len(list(tmp_path.glob(checkpoints))) >= len(FLAGS)  # rank 0 wrote its checkpoints
