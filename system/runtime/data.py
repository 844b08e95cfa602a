"""Deterministic synthetic token data: every system trains on the same batches in the same order.

A fixed random Markov chain on ``active_tokens`` tokens of the vocabulary (a seeded subset): each
token has ``branching`` possible successors (drawn once from the seed), each equally likely, so
the best achievable loss is ``log(branching)`` nats (≈1.39 for 4) against ``log(vocab)`` at
initialisation (≈6.24 for the debug vocabulary of 512). The unigram part (log vocab -> log
active) is learnt within tens of steps, so loss visibly falls in short runs, which makes
equivalence tests and smoke runs meaningful.

Global batch ``i`` is a (global_batch_size, seq_length + 1) int64 tensor that depends only on
``(seed, i)``; inputs are ``batch[:, :-1]`` and targets ``batch[:, 1:]``. Replica ``r`` of ``dp``
takes rows ``r·G/dp … (r+1)·G/dp − 1`` (its macro-batch, paper §2), cut into micro-batches of
``micro_batch_size`` rows in order:

    >>> data = SyntheticData(vocab_size=16, seq_length=5, global_batch_size=8, seed=0)
    >>> b = data.batch(3)
    >>> tuple(b.shape), bool((data.batch(3) == b).all())
    ((8, 6), True)
    >>> mbs = micro_batches(b, dp=2, replica=1, micro_batch_size=2)
    >>> len(mbs), bool((mbs[0][0] == b[4:6, :-1]).all())
    (2, True)

:func:`make_data` picks the data a spec names: this chain (``data="synthetic"``) or the real
text corpus (``data="kjv"``, :mod:`system.runtime.corpus`). Both give ``batch(i)`` and
``sample_ids(i)`` (each row's dataset index; every synthetic row is a new sample);
:func:`micro_samples` cuts the ids as :func:`micro_batches` cuts the rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from system.runtime.spec import DATASETS

__all__ = [
    "DATASETS",
    "SyntheticData",
    "make_data",
    "micro_batches",
    "micro_samples",
    "entropy_floor",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class SyntheticData:
    """Batches of a seeded Markov chain; ``batch(i)`` is pure in ``(seed, i)``."""

    vocab_size: int
    seq_length: int
    global_batch_size: int
    seed: int = 0
    branching: int = 4  # successors per token; the loss floor is log(branching)
    active_tokens: int = 64  # the chain lives on this many tokens (a seeded subset of the vocab)

    def __post_init__(self) -> None:
        for k in ("vocab_size", "seq_length", "global_batch_size", "branching"):
            if getattr(self, k) < 1:
                raise ValueError(f"SyntheticData: {k} must be >= 1, got {getattr(self, k)}")
        if not self.branching <= self.active_tokens:
            raise ValueError(
                f"SyntheticData: branching={self.branching} exceeds "
                f"active_tokens={self.active_tokens}"
            )

    @property
    def _active(self) -> int:
        return min(self.active_tokens, self.vocab_size)

    def _successors(self) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 0])
        tokens = rng.choice(self.vocab_size, size=self._active, replace=False)
        # (V, branching) successor table over the active tokens, fixed by the seed
        return tokens[rng.integers(0, self._active, size=(self.vocab_size, self.branching))]

    def batch(self, i: int) -> torch.Tensor:
        """Global batch ``i`` (i >= 0) as a (global_batch_size, seq_length + 1) LongTensor."""
        if i < 0:
            raise ValueError(f"SyntheticData.batch: index must be >= 0, got {i}")
        succ = self._successors()
        rng = np.random.default_rng([self.seed, 1, int(i)])
        g, n = self.global_batch_size, self.seq_length + 1
        out = np.empty((g, n), dtype=np.int64)
        out[:, 0] = succ[rng.integers(0, self.vocab_size, size=g), 0]
        choice = rng.integers(0, self.branching, size=(g, n - 1))
        for t in range(1, n):
            out[:, t] = succ[out[:, t - 1], choice[:, t - 1]]
        return torch.from_numpy(out)

    def sample_ids(self, i: int) -> np.ndarray:
        """Every synthetic row is a sample of its own: ``i·G … i·G + G − 1``."""
        g = self.global_batch_size
        return np.arange(i * g, (i + 1) * g, dtype=np.int64)


def make_data(spec):
    """The data of a run spec (``data``, ``seed``, batch and model shape; ``train_sequences``
    for the corpus): :class:`SyntheticData` or :class:`system.runtime.corpus.CorpusData`."""
    cfg = spec.gpt_config()
    if spec.data == "kjv":
        from system.runtime.corpus import CorpusData

        return CorpusData(
            seq_length=cfg.seq_length,
            global_batch_size=spec.global_batch_size,
            seed=spec.seed,
            train_sequences=spec.train_sequences,
        )
    if spec.data != "synthetic":
        raise ValueError(f"make_data: data {spec.data!r} is not one of {DATASETS}")
    return SyntheticData(
        vocab_size=cfg.vocab_size,
        seq_length=cfg.seq_length,
        global_batch_size=spec.global_batch_size,
        seed=spec.seed,
    )


def micro_samples(ids, *, dp: int, replica: int, micro_batch_size: int) -> list[list[int]]:
    """Replica ``replica``'s micro-batches of a global batch's sample ids (as micro_batches)."""
    ids = [int(x) for x in ids]
    per = len(ids) // dp
    rows = ids[replica * per : (replica + 1) * per]
    return [rows[j : j + micro_batch_size] for j in range(0, per, micro_batch_size)]


def micro_batches(
    batch: torch.Tensor, *, dp: int, replica: int, micro_batch_size: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Replica ``replica``'s micro-batches of a global batch, as (inputs, targets) pairs."""
    g = batch.shape[0]
    if dp < 1 or not 0 <= replica < dp:
        raise ValueError(f"micro_batches: replica {replica} not in 0..dp-1 for dp={dp}")
    if micro_batch_size < 1 or g % (dp * micro_batch_size):
        raise ValueError(
            f"micro_batches: global batch {g} is not divisible by dp={dp} x "
            f"micro_batch_size={micro_batch_size}"
        )
    per = g // dp
    rows = batch[replica * per : (replica + 1) * per]
    return [
        (rows[j : j + micro_batch_size, :-1], rows[j : j + micro_batch_size, 1:])
        for j in range(0, per, micro_batch_size)
    ]


def entropy_floor(branching: int = 4) -> float:
    """The lowest expected loss (nats per token) on this data: log(branching)."""
    return float(np.log(branching))
