"""Cluster: devices, their hosts and regions, and the links between them (paper §2).

A link (d, d') has a one-way latency ``delay_ms`` and a bandwidth ``bandwidth_gbps``. Both
matrices are symmetric. Data files and printouts use ms and Gbit/s; code that computes times
uses :attr:`Cluster.delay_s` and :attr:`Cluster.bandwidth_bps` (SI units).

Delay semantics (decided once for the whole project): ``delay_ms`` is the latency one message
pays from sender to receiver, i.e. the α of the paper's cost model ``t = α + 8·X/β``. The
paper's tables look like NCCL round-trip measurements, but the authors applied each value as
one-way netem delay on both sides, so their runs (and their scheduler) paid the table value per
message. We do the same: the emulator applies ``delay_ms`` per direction, so a ping between two
emulated devices shows RTT = 2·delay_ms.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import weakref
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from system.gpus import DEFAULT_GPU, get_gpu
from system.links import KindPairCurves, SizeDependentLinks

__all__ = [
    "Cluster",
    "LinkSharing",
    "LINK_SHARING",
    "DEFAULT_LINK_SHARING",
    "MEASURED_STREAMS",
    "link_time_s",
    "fingerprint",
    "fingerprint_from_recipe",
]

# How concurrent flows share the links: the models' names (what each one caps is in
# :mod:`system.simulator.sharing`, which allocates the rates) and the one default, the model of
# the paper's own tc-shaped runs: the named cases carry it, and the harness's ``link_sharing``
# option defaults to it.
LINK_SHARING = ("pair", "nic", "region", "flow", "tc_class")
DEFAULT_LINK_SHARING = "tc_class"
MEASURED_STREAMS = 16  # sockets per pair in the authors' NCCL benchmark (4 threads x 4 sockets)


def link_time_s(delay_s: npt.ArrayLike, bandwidth_bps: npt.ArrayLike, nbytes: float) -> np.ndarray:
    """Paper §2: time to move ``nbytes`` over a link, ``α + 8·X/β`` (seconds)."""
    return np.asarray(delay_s, dtype=float) + 8.0 * float(nbytes) / np.asarray(bandwidth_bps, float)


@dataclass(frozen=True, slots=True)
class LinkSharing:
    """A link-sharing model and its settings: ``model`` one of :data:`LINK_SHARING`;
    ``streams`` (``flow`` only) sockets per connection, by default as many as the pair figures
    were measured with; ``nic_gbps`` (``nic`` only) the device cap, by default each device's
    fastest link.

    >>> LinkSharing("nic", nic_gbps=2.0).label()
    'nic'
    """

    model: str = DEFAULT_LINK_SHARING
    streams: int = MEASURED_STREAMS
    nic_gbps: float | None = None

    def __post_init__(self) -> None:
        if self.model not in LINK_SHARING:
            raise ValueError(
                f"link sharing must be one of {', '.join(LINK_SHARING)}, got {self.model!r}"
            )
        if isinstance(self.streams, bool) or int(self.streams) != self.streams or self.streams < 1:
            raise ValueError(f"link sharing: streams must be an integer >= 1, got {self.streams!r}")
        if self.streams != MEASURED_STREAMS and self.model != "flow":
            raise ValueError(f"link sharing: streams applies to flow only, not {self.model}")
        if self.nic_gbps is not None:
            if not float(self.nic_gbps) > 0:
                raise ValueError(f"link sharing: nic_gbps must be > 0, got {self.nic_gbps}")
            if self.model != "nic":
                raise ValueError(f"link sharing: nic_gbps applies to nic only, not {self.model}")
            object.__setattr__(self, "nic_gbps", float(self.nic_gbps))
        object.__setattr__(self, "streams", int(self.streams))

    def label(self) -> str:
        """The model's name, as a result row records it (column ``link_sharing``)."""
        return self.model


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """Devices and the links between them for one network case.

    Example:
        >>> import numpy as np
        >>> c = Cluster(name="two", region_of=("a", "b"), host_of=(0, 1),
        ...             delay_ms=np.array([[0, 10.0], [10.0, 0]]),
        ...             bandwidth_gbps=np.array([[0, 1.0], [1.0, 0]]))
        >>> float(c.link_time_s(1e9 / 8)[0, 1])  # 10 ms + 1 Gbit / 1 Gbit/s
        1.01
    """

    name: str
    region_of: tuple[str, ...]  # region name per device, len D
    host_of: tuple[int, ...]  # host id per device, len D (devices of a host share its NIC)
    delay_ms: npt.NDArray[np.float64]  # (D, D) one-way latency, symmetric, zero diagonal
    bandwidth_gbps: npt.NDArray[np.float64]  # (D, D) Gbit/s, symmetric, > 0 off-diagonal
    # Optional per-host NIC bandwidth (Gbit/s) shared by all devices of a host for traffic that
    # leaves the host; None means every device has links of its own (no sharing).
    host_nic_gbps: tuple[float, ...] | None = None
    # GPU type per device (a :data:`system.gpus.GPU_TYPES` key); None: every device is a V100,
    # the paper's testbed.
    gpu_of: tuple[str, ...] | None = None
    # Optional message-size-dependent bandwidth curves per host pair
    # (:class:`system.links.SizeDependentLinks`); None: flat α-β links.
    links: SizeDependentLinks | None = None
    # How concurrent flows share the links (:mod:`system.simulator.sharing`): the simulator
    # reads it here and nowhere else. None: not said, and the simulator refuses the cluster;
    # :func:`system.cases.get_case` gives its clusters :data:`DEFAULT_LINK_SHARING`.
    link_sharing: LinkSharing | None = None
    description: str = ""
    meta: dict = field(default_factory=dict, compare=False)  # provenance (case, variant, scale)
    # values computed once per cluster (its fingerprint, SI views of its matrices): the cluster
    # never changes, and a copy (dataclasses.replace) starts with an empty memo
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        d = len(self.region_of)
        where = f"cluster {self.name!r}"
        if d < 1:
            raise ValueError(f"{where}: needs at least one device")
        if len(self.host_of) != d:
            raise ValueError(f"{where}: host_of has {len(self.host_of)} entries, expected {d}")
        delay = _kept_or_copied(self.delay_ms, 0.0)
        bw = _kept_or_copied(self.bandwidth_gbps, np.inf)
        diagonal = (np.arange(d), np.arange(d))
        for label, m in (("delay_ms", delay), ("bandwidth_gbps", bw)):
            if m.shape != (d, d):
                raise ValueError(f"{where}: {label} has shape {m.shape}, expected ({d}, {d})")
        if not (_is_checked(delay) and _is_checked(bw)):  # a copy's or subset's are checked
            _check_values(where, delay, bw, diagonal)
        for m, own in ((delay, 0.0), (bw, np.inf)):  # a device talking to itself is free
            if m.flags.writeable:
                np.fill_diagonal(m, own)
                m.setflags(write=False)
            _mark_checked(m)  # read-only from here on: these checks hold for good
        object.__setattr__(self, "delay_ms", delay)
        object.__setattr__(self, "bandwidth_gbps", bw)
        object.__setattr__(self, "region_of", tuple(map(str, self.region_of)))
        object.__setattr__(self, "host_of", tuple(map(int, self.host_of)))
        if self.host_nic_gbps is not None:
            nics = tuple(float(x) for x in self.host_nic_gbps)
            if len(nics) != self.num_hosts or min(nics) <= 0:
                raise ValueError(f"{where}: host_nic_gbps needs {self.num_hosts} positive values")
            object.__setattr__(self, "host_nic_gbps", nics)
        if self.link_sharing is not None and not isinstance(self.link_sharing, LinkSharing):
            raise ValueError(
                f"{where}: link_sharing must be a LinkSharing or None, got {self.link_sharing!r}"
            )
        if self.gpu_of is not None:
            gpus = tuple(map(str, self.gpu_of))
            if len(gpus) != d:
                raise ValueError(f"{where}: gpu_of has {len(gpus)} entries, expected {d}")
            for g in set(gpus):
                get_gpu(g)  # names the unknown type
            object.__setattr__(self, "gpu_of", gpus)

    def __getstate__(self) -> dict:  # a pickled cluster leaves its memo behind
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}

    def __setstate__(self, state: dict) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_memo", {})

    # ---- sizes -------------------------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        return len(self.region_of)

    @property
    def num_hosts(self) -> int:
        return max(self.host_of) + 1

    @property
    def gpus(self) -> tuple[str, ...]:
        """GPU type per device (V100 where the cluster names none)."""
        return self.gpu_of if self.gpu_of is not None else (DEFAULT_GPU,) * self.num_devices

    def peak_flops(self) -> np.ndarray:
        """(D,) dense FP16 peak FLOP/s per device, from its GPU type."""
        return np.array([get_gpu(g).peak_flops for g in self.gpus])

    def memory_bytes(self) -> np.ndarray:
        """(D,) on-board memory per device, from its GPU type."""
        return np.array([get_gpu(g).memory_bytes for g in self.gpus])

    @property
    def regions(self) -> tuple[str, ...]:
        """Distinct region names in order of first appearance."""
        return tuple(dict.fromkeys(self.region_of))

    # ---- SI views ------------------------------------------------------------------------------
    @property
    def delay_s(self) -> np.ndarray:
        return self.memo("delay_s", lambda: _read_only(self.delay_ms * 1e-3))

    @property
    def bandwidth_bps(self) -> np.ndarray:
        return self.memo("bandwidth_bps", lambda: _read_only(self.bandwidth_gbps * 1e9))

    @property
    def host_ids(self) -> np.ndarray:
        """(D,) host of each device, as a read-only integer array."""
        return self.memo("host_ids", lambda: _read_only(np.asarray(self.host_of, dtype=int)))

    def memo(self, name: str, make):
        """The value ``make()`` computes from this cluster, computed once (a simulation reads
        the SI views thousands of times per configuration grid); ``name`` names the value."""
        try:
            return self._memo[name]
        except KeyError:
            value = self._memo[name] = make()
            return value

    def link_time_s(self, nbytes: float) -> np.ndarray:
        """(D, D) seconds to move ``nbytes`` over each link; zero on the diagonal."""
        t = link_time_s(self.delay_s, self.bandwidth_bps, nbytes)
        np.fill_diagonal(t, 0.0)
        return t

    # ---- derived clusters ------------------------------------------------------------------
    def subset(self, devices: list[int] | tuple[int, ...], name: str | None = None) -> Cluster:
        """The cluster restricted to ``devices`` (renumbered 0..k-1 in the given order)."""
        idx = np.asarray(devices, dtype=int)
        if idx.size == 0 or len(set(idx.tolist())) != idx.size:
            raise ValueError(f"subset of {self.name!r}: devices must be distinct and non-empty")
        if idx.min() < 0 or idx.max() >= self.num_devices:
            raise ValueError(
                f"subset of {self.name!r}: device ids outside 0..{self.num_devices - 1}"
            )
        hosts = [self.host_of[i] for i in idx]
        remap = {h: k for k, h in enumerate(dict.fromkeys(hosts))}
        # principal submatrices (distinct devices) of this cluster's checked matrices are finite,
        # symmetric and of the right signs too: handed over read-only, they are neither copied
        # again nor checked again (:func:`_kept_or_copied`, :func:`_mark_checked`)
        delay, bw = self.delay_ms[np.ix_(idx, idx)], self.bandwidth_gbps[np.ix_(idx, idx)]
        inherited = _is_checked(self.delay_ms) and _is_checked(self.bandwidth_gbps)
        for m in (delay, bw):
            m.setflags(write=False)
            if inherited:
                _mark_checked(m)
        nics = None
        if self.host_nic_gbps is not None:
            nics = tuple(self.host_nic_gbps[h] for h in remap)
        return Cluster(
            name=name or f"{self.name}[{len(idx)}]",
            region_of=tuple(self.region_of[i] for i in idx),
            host_of=tuple(remap[h] for h in hosts),
            delay_ms=delay,
            bandwidth_gbps=bw,
            host_nic_gbps=nics,
            gpu_of=None if self.gpu_of is None else tuple(self.gpu_of[i] for i in idx),
            links=None if self.links is None else self.links.subset(list(remap)),
            link_sharing=self.link_sharing,
            description=self.description,
            meta={**self.meta, "subset_of": self.name, "subset_devices": idx.tolist()},
        )

    def scaled(self, *, bandwidth_scale: float = 1.0, delay_scale: float = 1.0) -> Cluster:
        """Same topology with every bandwidth × ``bandwidth_scale`` and delay × ``delay_scale``."""
        if bandwidth_scale <= 0 or delay_scale < 0:
            raise ValueError("scaled: bandwidth_scale must be > 0 and delay_scale >= 0")
        nics = self.host_nic_gbps
        if nics is not None:
            nics = tuple(x * bandwidth_scale for x in nics)
        return Cluster(
            name=self.name,
            region_of=self.region_of,
            host_of=self.host_of,
            delay_ms=self.delay_ms * delay_scale,
            bandwidth_gbps=self.bandwidth_gbps * bandwidth_scale,
            host_nic_gbps=nics,
            gpu_of=self.gpu_of,
            links=self.links,
            link_sharing=self.link_sharing,
            description=self.description,
            meta={
                **self.meta,
                "bandwidth_scale": self.meta.get("bandwidth_scale", 1.0) * bandwidth_scale,
                "delay_scale": self.meta.get("delay_scale", 1.0) * delay_scale,
            },
        )

    def permuted(self, perm: list[int] | np.ndarray) -> Cluster:
        """Relabel devices: new device i is old device ``perm[i]``."""
        return self.subset(list(perm), name=self.name)


def _read_only(matrix: np.ndarray) -> np.ndarray:
    matrix.setflags(write=False)
    return matrix


def fingerprint(cluster: Cluster) -> str:
    """SHA-256 of everything a cluster's links and devices are: regions, hosts, NICs, GPUs, both
    matrices, size-dependent links and the link-sharing model — not its name or provenance. Two
    clusters built apart from the same data (the jobs of a sweep each read their case) have the
    same fingerprint, so work keyed by it is shared between them. A builder may give its
    clusters the fingerprint of how they were built instead (:func:`fingerprint_from_recipe`)."""

    def make() -> str:
        h = hashlib.sha256()
        ls = cluster.link_sharing
        sharing = None if ls is None else dataclasses.asdict(ls)
        plain = [cluster.region_of, cluster.host_of, cluster.host_nic_gbps, cluster.gpu_of, sharing]
        h.update(json.dumps(plain, default=str).encode())
        for m in (cluster.delay_ms, cluster.bandwidth_gbps):
            h.update(np.ascontiguousarray(m, dtype=np.float64).tobytes())
        h.update(_links_digest(cluster.links))
        return h.hexdigest()

    return cluster.memo("fingerprint", make)


def _check_values(where: str, delay: np.ndarray, bw: np.ndarray, diagonal) -> None:
    """ValueError unless both matrices are finite off the diagonal and symmetric, every delay
    >= 0 and every bandwidth off the diagonal > 0."""
    for label, m in (("delay_ms", delay), ("bandwidth_gbps", bw)):
        if not m.any():
            continue  # all zeros: finite and symmetric
        bad = ~np.isfinite(m)
        bad[diagonal] = False  # only the off-diagonal entries are read
        if bad.any():
            raise ValueError(f"{where}: {label} has non-finite off-diagonal entries")
        if not (np.array_equal(m, m.T) or np.allclose(m, m.T, rtol=1e-9, atol=1e-12)):
            i, j = np.argwhere(~np.isclose(m, m.T))[0]
            raise ValueError(
                f"{where}: {label} is not symmetric: [{i},{j}]={m[i, j]} vs [{j},{i}]={m[j, i]}"
            )
    negative = delay < 0
    negative[diagonal] = False
    if negative.any():
        raise ValueError(f"{where}: delay_ms has negative entries")
    down = bw <= 0
    down[diagonal] = False
    if down.any():
        i, j = np.argwhere(down)[0]
        raise ValueError(f"{where}: bandwidth_gbps[{i},{j}]={bw[i, j]} must be > 0")


# The read-only matrices a cluster has checked (finite, symmetric, delays >= 0, bandwidths > 0
# off the diagonal), by id, each with a weak reference that drops its entry when the matrix goes:
# a copy (dataclasses.replace) or a subset of a checked cluster is not checked again.
_CHECKED: dict[int, weakref.ref] = {}


def _is_checked(m: np.ndarray) -> bool:
    ref = _CHECKED.get(id(m))
    return ref is not None and ref() is m


def _mark_checked(m: np.ndarray) -> None:
    """Record ``m`` (read-only, never writable again) as checked."""
    if m.flags.writeable:
        raise ValueError("only a read-only matrix can be recorded as checked")
    key = id(m)
    _CHECKED[key] = weakref.ref(m, lambda _ref, key=key: _CHECKED.pop(key, None))


def _kept_or_copied(m, diagonal: float) -> np.ndarray:
    """A cluster's own float64 copy of matrix ``m``; ``m`` itself where it already is a
    read-only float64 array that owns its data, with ``diagonal`` on its diagonal, as a cluster
    keeps it (a builder of many large clusters hands its matrices over so, and saves copying
    them; an array handed over becomes the cluster's, never to be made writable again). A
    read-only view of a writable array is copied."""
    if (
        isinstance(m, np.ndarray)
        and m.dtype == np.float64
        and not m.flags.writeable
        and m.flags.owndata
        and m.ndim == 2
        and bool((np.diagonal(m) == diagonal).all())
    ):
        return m
    return np.array(m, dtype=np.float64)


def fingerprint_from_recipe(cluster: Cluster, recipe: str) -> None:
    """Give ``cluster``, just built, the fingerprint of how it was built instead of one hashed
    from its matrices: SHA-256 of ``recipe`` (the builder's name and every input that decides
    the cluster's content, regions, hosts, GPUs and matrices included), its size-dependent
    links and its link-sharing model. A builder of thousands of large clusters (a planner's
    candidate layouts) saves hashing (D, D) matrices each time. Clusters of one recipe share
    the fingerprint; a cluster of the same content built another way has another, so work keyed
    by it is not shared between the two (never wrongly shared)."""
    if "fingerprint" in cluster._memo:
        raise ValueError(f"cluster {cluster.name!r} already has a fingerprint")
    h = hashlib.sha256(b"recipe")
    ls = cluster.link_sharing
    sharing = None if ls is None else dataclasses.asdict(ls)
    h.update(json.dumps([recipe, sharing], default=str).encode())
    h.update(_links_digest(cluster.links))
    cluster._memo["fingerprint"] = h.hexdigest()


def _links_digest(links) -> bytes:
    """SHA-256 of a cluster's size-dependent links, as exact as their ``repr``: per map
    (``between``, then ``within``) its keys in order and, per key, which of the map's distinct
    curves it holds, each distinct curve by its ``repr`` (computed once per curve object: a
    fleet of N nodes has N² pairs but a few distinct curves)."""
    if not isinstance(links, SizeDependentLinks):
        return repr(links).encode()
    h = hashlib.sha256(b"SizeDependentLinks")
    for part in (links.between, links.within):
        if isinstance(part, KindPairCurves):
            h.update(part.digest())
            continue
        text_of: dict[int, str] = {}
        code_of: dict[str, int] = {}
        codes = []
        for c in part.values():
            t = text_of.get(id(c))
            if t is None:
                t = text_of[id(c)] = repr(c)
            codes.append(code_of.setdefault(t, len(code_of)))
        h.update(json.dumps(list(code_of)).encode())
        h.update(np.asarray(list(part), dtype=np.int64).tobytes())
        h.update(np.asarray(codes, dtype=np.int64).tobytes())
        h.update(len(codes).to_bytes(8, "little"))
    return h.digest()
