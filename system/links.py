"""Message-size-dependent links: bandwidth as a function of the message size.

The α-β model (:mod:`system.simulator.transfers`) charges every message ``α + 8·X/β`` with one
β per link. Measured point-to-point bandwidth is not flat: small messages pay latency and protocol
set-up, so the bytes-per-second a transfer reaches grows with its size until the link saturates.
Sailor (Strati et al., SOSP 2025) measures it with NCCL send/recv between two nodes for messages
of 2^16 .. 2^30 bytes and fits ``β(x) = a·x² + b·x + c`` GB/s with ``x = log2(bytes / 1e6)``;
:class:`BandwidthCurve` is that fit, with what a fit cannot say made explicit:

- outside the measured sizes the quadratic is not evidence, so a message is charged as if it
  had the nearest measured size's bandwidth (above 2^30 bytes) or took the time of the smallest
  measured size at which the fit is positive (below it: a latency floor, the time a small message
  takes does not shrink with its size);
- the fitted value is capped at the measured peak.

:class:`SizeDependentLinks` attaches such curves to a :class:`~system.cluster.Cluster` (its
``links`` field), one per ordered host pair plus one per host for traffic inside it. The
cluster's ``bandwidth_gbps`` matrix then holds each device pair's *per-flow peak*, so the
sharing rules of :func:`system.simulator.transfers.flow_bandwidth_bps` (flows on one pair split
it; host NICs) act on it unchanged, and a transfer of X bytes reaches the fraction
``β(X)/β_peak`` of that (:meth:`SizeDependentLinks.efficiency`);
:func:`system.simulator.transfers.flow_time_s` applies it, so every collective built on it
(rings, trees, the sharded PS) becomes size-dependent too. The latency α is part of the fitted
curve, so clusters built from fits carry ``delay_ms`` = 0.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

__all__ = [
    "BandwidthCurve",
    "CurveStack",
    "KindPairCurves",
    "SizeDependentLinks",
    "FIT_MIN_BYTES",
    "FIT_MAX_BYTES",
]

FIT_MIN_BYTES = 2.0**16  # smallest message Sailor's send/recv probe measures
FIT_MAX_BYTES = 2.0**30  # largest one


@dataclass(frozen=True, slots=True)
class BandwidthCurve:
    """``β(x) = a·x² + b·x + c`` GB/s, x = log2(bytes / 1e6), capped at ``peak_bps`` (bit/s).

    ``flows``: how many concurrent flows the measurement's bandwidth is the sum of (Sailor runs
    one send/recv pair per GPU of each node at once and reports total bytes over time), so one
    flow's share is ``β / flows``.

    >>> c = BandwidthCurve(0.0, 0.0, 2.0, peak_bps=16e9)   # flat 2 GB/s
    >>> round(float(c.time_s(1e9)), 6)                     # 1 GB at 2 GB/s
    0.5
    """

    a: float
    b: float
    c: float
    peak_bps: float
    flows: int = 1
    min_bytes: float = FIT_MIN_BYTES
    max_bytes: float = FIT_MAX_BYTES

    def __post_init__(self) -> None:
        for name in ("a", "b", "c", "peak_bps"):
            if not math.isfinite(float(getattr(self, name))):
                raise ValueError(f"bandwidth curve: {name} must be a finite number")
        if self.peak_bps <= 0 or self.flows < 1 or not 0 < self.min_bytes < self.max_bytes:
            raise ValueError("bandwidth curve: needs peak_bps > 0, flows >= 1, 0 < min < max bytes")
        if self._raw_gbs(self.max_bytes) <= 0 and self._raw_gbs(self.min_bytes) <= 0:
            raise ValueError("bandwidth curve: not positive at any measured message size")

    def _raw_gbs(self, nbytes: float) -> float:
        x = math.log2(nbytes / 1e6)
        return self.a * x * x + self.b * x + self.c

    @property
    def floor_bytes(self) -> float:
        """Smallest measured size (a power of two from ``min_bytes``) where the fit is positive."""
        n = self.min_bytes
        while self._raw_gbs(n) <= 0:
            n *= 2.0
        return n

    def bandwidth_bps(self, nbytes) -> np.ndarray:
        """Effective bandwidth (bit/s, all ``flows`` together) a message of ``nbytes`` reaches."""
        nb = np.asarray(nbytes, dtype=float)
        floor = self.floor_bytes
        x = np.log2(np.clip(nb, floor, self.max_bytes) / 1e6)
        gbs = self.a * x * x + self.b * x + self.c
        bw = np.minimum(gbs * 8e9, self.peak_bps)
        # below the floor the message takes the floor's time: bandwidth scales with its size
        return np.where(nb < floor, bw * np.maximum(nb, 0.0) / floor, bw)

    def time_s(self, nbytes) -> np.ndarray:
        """Seconds for one message of ``nbytes`` when all ``flows`` move such a message at once."""
        nb = np.asarray(nbytes, dtype=float)
        bw = self.bandwidth_bps(np.maximum(nb, 1.0))
        return np.where(nb > 0, 8.0 * self.flows * nb / bw, 0.0)

    def efficiency(self, nbytes) -> np.ndarray:
        """``β(nbytes) / β_peak`` in (0, 1]."""
        return np.maximum(self.bandwidth_bps(np.maximum(nbytes, 1.0)) / self.peak_bps, 1e-12)


class CurveStack:
    """Several :class:`BandwidthCurve` s timed at one message size in one array step:
    ``CurveStack(curves).time_s(n)[k] == curves[k].time_s(n)``, the same operations element by
    element (a planner asking for the slowest of many node pairs at many sizes)."""

    __slots__ = ("a", "b", "c", "peak_bps", "flows", "floor_bytes", "max_bytes")

    def __init__(self, curves: list[BandwidthCurve]) -> None:
        if not curves:
            raise ValueError("a curve stack needs at least one curve")
        for name in self.__slots__:
            setattr(self, name, np.array([getattr(c, name) for c in curves], dtype=float))

    def time_s(self, nbytes: float) -> np.ndarray:
        """Seconds for one message of ``nbytes`` on each curve (:meth:`BandwidthCurve.time_s`)."""
        nb = float(nbytes)
        if not nb > 0:
            return np.zeros(self.a.shape)
        one = max(nb, 1.0)
        x = np.log2(np.minimum(np.maximum(one, self.floor_bytes), self.max_bytes) / 1e6)
        gbs = self.a * x * x + self.b * x + self.c
        bw = np.minimum(gbs * 8e9, self.peak_bps)
        bw = np.where(one < self.floor_bytes, bw * one / self.floor_bytes, bw)
        return 8.0 * self.flows * nb / bw


@functools.lru_cache(maxsize=1 << 16)
def _efficiency(curve: BandwidthCurve, nbytes: float) -> float:
    """``curve.efficiency(nbytes)``, kept per (curve, size): a simulation asks again for every
    flow of the same size between hosts of the same pair of kinds."""
    return float(curve.efficiency(nbytes))


class KindPairCurves(Mapping):
    """The ``between`` map of :class:`SizeDependentLinks` for hosts of a few kinds: host h is
    of kind ``kind_of_host[h]`` and traffic from host h to host h' (h != h') follows
    ``curves[(kind h, kind h')]``. The same content as the dict of every ordered host pair, in
    the memory and time of the kinds (a fleet of N nodes has N² pairs and a few kinds)."""

    __slots__ = ("_kind", "_curves")

    def __init__(
        self, kind_of_host: tuple[int, ...], curves: Mapping[tuple[int, int], BandwidthCurve]
    ) -> None:
        self._kind = tuple(int(k) for k in kind_of_host)
        self._curves = dict(curves)

    def curves_of(self, host_src: list[int], host_dst: list[int]) -> list:
        """``self.get((s, d))`` for each pair of the two lists (None where there is no curve or
        s == d), read off the kinds without a lookup per pair through the mapping."""
        kind, curves, n = self._kind, self._curves, len(self._kind)
        return [
            curves.get((kind[s], kind[d])) if s != d and 0 <= s < n and 0 <= d < n else None
            for s, d in zip(host_src, host_dst, strict=True)
        ]

    def __getitem__(self, key) -> BandwidthCurve:
        try:
            i, j = key
            ki, kj = self._kind[i], self._kind[j]
        except (TypeError, ValueError, IndexError):
            raise KeyError(key) from None
        if i == j or i < 0 or j < 0:
            raise KeyError(key)
        return self._curves[(ki, kj)]

    def __iter__(self):
        n = len(self._kind)
        for i in range(n):
            for j in range(n):
                if i != j and (self._kind[i], self._kind[j]) in self._curves:
                    yield (i, j)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"KindPairCurves(kind_of_host={self._kind!r}, curves={self._curves!r})"

    def subset(self, hosts: list[int]) -> KindPairCurves:
        """The map of ``hosts`` (old ids), renumbered 0..k-1 in the given order."""
        return KindPairCurves(tuple(self._kind[h] for h in hosts), self._curves)

    def digest(self) -> bytes:
        """SHA-256 of the kinds and the curves: equal digests, equal maps."""
        h = hashlib.sha256(b"KindPairCurves")
        h.update(np.asarray(self._kind, dtype=np.int64).tobytes())
        h.update(repr(sorted(self._curves.items())).encode())
        return h.digest()


@dataclass(frozen=True, slots=True)
class SizeDependentLinks:
    """Bandwidth curves of a cluster's links, by host: ``between[(h, h')]`` for traffic from
    host h to host h' (h != h'), ``within[h]`` for traffic between two devices of host h.

    Every device pair whose hosts have no curve keeps its flat α-β bandwidth (efficiency 1).
    """

    between: Mapping[tuple[int, int], BandwidthCurve]
    within: Mapping[int, BandwidthCurve]

    def per_flow_peak_gbps(self, hs: int, hd: int) -> float | None:
        """Peak Gbit/s of one flow from host ``hs`` to ``hd`` (None: no curve)."""
        c = self.within.get(hs) if hs == hd else self.between.get((hs, hd))
        return None if c is None else c.peak_bps / c.flows / 1e9

    def efficiency(self, host_src, host_dst, nbytes) -> np.ndarray:
        """Fraction of its per-flow peak a flow of ``nbytes`` reaches, per flow (1: no curve)."""
        hs = np.asarray(host_src, dtype=int)
        hd = np.asarray(host_dst, dtype=int)
        nb = np.broadcast_to(np.asarray(nbytes, dtype=float), hs.shape)
        src, dst, sizes = hs.ravel().tolist(), hd.ravel().tolist(), nb.ravel().tolist()
        within, between = self.within, self.between
        if isinstance(between, KindPairCurves):  # between hosts: by kinds, in one pass
            curves = between.curves_of(src, dst)
        else:
            curves = [
                None if s == d else between.get((s, d)) for s, d in zip(src, dst, strict=True)
            ]
        out = []
        seen: dict[tuple[int, float], float] = {}  # this call's (curve, size)s: few distinct
        for s, d, c, b in zip(src, dst, curves, sizes, strict=True):
            if s == d:
                c = within.get(s)  # inside a host: its curve, if any
            if c is None:
                out.append(1.0)
                continue
            e = seen.get((id(c), b))
            if e is None:
                e = seen[(id(c), b)] = _efficiency(c, b)
            out.append(e)
        return np.array(out, dtype=float).reshape(hs.shape)

    def subset(self, hosts: list[int]) -> SizeDependentLinks:
        """The curves of ``hosts`` (old ids), renumbered 0..k-1 in the given order."""
        new = {h: i for i, h in enumerate(hosts)}
        if isinstance(self.between, KindPairCurves):
            between = self.between.subset(hosts)
        else:
            between = {
                (new[a], new[b]): c for (a, b), c in self.between.items() if a in new and b in new
            }
        return SizeDependentLinks(
            between=between, within={new[h]: c for h, c in self.within.items() if h in new}
        )
