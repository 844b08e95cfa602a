"""Link-sharing models: what bandwidth each of a set of concurrent flows gets (max-min fair).

A case gives one bandwidth β per ordered device pair; how concurrent flows share the network
behind those numbers is a modelling choice, each choice a named model (``link_sharing=`` in every
result row). Every model allocates rates max-min fairly (progressive filling, Bertsekas &
Gallager, *Data Networks*, §6.5.2) over the capacities it names:

- ``pair``: each ordered device pair's flows share its β; pairs are independent;
- ``nic``: as ``pair``, plus every device's egress and ingress capped at its fastest link's
  bandwidth (in cases 3–5 the within-region 2 Gbit/s, paper §4.1), or at ``nic_gbps``;
- ``region``: as ``pair``, plus all flows from region A to region B share that region pair's β,
  as if the measured figure were the pipe between the regions;
- ``flow``: one TCP stream gets β / :data:`MEASURED_STREAMS` (the pair figures were measured by
  NCCL over 4 threads × 4 sockets, DS3Lab/DT-FM ``udp_hole_punching_test``), a connection of
  ``streams`` sockets that many times it, within the AWS instance quotas (Amazon EC2
  documentation, "Amazon EC2 instance network bandwidth"): :data:`AWS_REGION_EGRESS_GBPS` to
  other Regions and :data:`INSTANCE_GBPS` in all, per direction;
- ``tc_class``: the paper's own runs, emulated with ``tc`` on AWS instances in one VPC: per
  sender one ``netem delay … rate …`` class per distinct (delay, bandwidth) setting of its
  destinations (DS3Lab/DT-FM ``scheduler/generate_heterogeneous_tc.py``), so a sender's flows to
  one region share one rate; nothing else is shaped but the instance NIC (:data:`INSTANCE_GBPS`).

Hosts with a NIC of their own (``Cluster.host_nic_gbps``, cases 1–2) cap their cross-host egress
and ingress under every model; egress and ingress are separate capacities. A cluster carries its
model (:attr:`system.cluster.Cluster.link_sharing`); the simulator reads it there and refuses a
cluster without one. The named cases carry :data:`DEFAULT_LINK_SHARING` = ``tc_class``, since the
authors' training launcher applies their tc script before training (DS3Lab/DT-FM
``scripts/local_scripts/gpt3_xl_pp8_dp8.sh`` runs ``heterogeneous_setup_case<N>.sh``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from system.cluster import (
    DEFAULT_LINK_SHARING,
    LINK_SHARING,
    MEASURED_STREAMS,
    Cluster,
    LinkSharing,
    fingerprint,
)
from system.compiled import kernel

__all__ = [
    "LINK_SHARING",
    "DEFAULT_LINK_SHARING",
    "MEASURED_STREAMS",
    "LinkSharing",
    "AWS_REGION_EGRESS_GBPS",
    "INSTANCE_GBPS",
    "sharing_of",
    "link_sharing_of",
    "with_link_sharing",
    "max_min_rates",
    "shared_bandwidth_bps",
]

AWS_REGION_EGRESS_GBPS = 5.0  # EC2: traffic to other Regions, instances under 32 vCPUs
INSTANCE_GBPS = 10.0  # EC2 p3.2xlarge: "up to 10 Gigabit", inbound and outbound each


def sharing_of(cluster: Cluster) -> LinkSharing:
    """The link-sharing model ``cluster`` is simulated under (its ``link_sharing`` field).
    Raises ValueError, naming the cluster, for a cluster built without one."""
    if cluster.link_sharing is None:
        raise ValueError(
            f"cluster {cluster.name!r} has no link-sharing model: build it with "
            f"link_sharing=LinkSharing(...) or take with_link_sharing(cluster, "
            f"{DEFAULT_LINK_SHARING!r}), the default (system/simulator/sharing.py)"
        )
    return cluster.link_sharing


def link_sharing_of(cluster: Cluster) -> str:
    """The name of the model ``cluster`` is simulated under (:func:`sharing_of`)."""
    return sharing_of(cluster).label()


def with_link_sharing(
    cluster: Cluster,
    sharing: str,
    *,
    streams: int = MEASURED_STREAMS,
    nic_gbps: float | None = None,
) -> Cluster:
    """``cluster`` under one of :data:`LINK_SHARING`; ``streams``: sockets per connection under
    ``flow`` (default: as many as the pair figures were measured with); ``nic_gbps``: the
    device cap under ``nic`` (default: each device's fastest link). Raises ValueError for an
    unknown model or a setting the model does not have."""
    model = LinkSharing(str(sharing), streams, nic_gbps)
    if model == cluster.link_sharing:
        return cluster
    return replace(cluster, link_sharing=model)


def max_min_rates(
    capacity_bps: np.ndarray, flow_of: np.ndarray, resource_of: np.ndarray, num_flows: int
) -> np.ndarray:
    """Max-min fair rates of ``num_flows`` flows over capacities ``capacity_bps`` (R,); flow
    ``flow_of[k]`` uses resource ``resource_of[k]``. Every flow must use at least one resource.

    Progressive filling: all unfrozen flows rise together until a resource is full; its flows
    freeze; repeat (at most R rounds). Compiled (:func:`_progressive_filling`).

    >>> max_min_rates(np.array([3.0, 10.0]), np.array([0, 1, 1]), np.array([0, 0, 1]), 2).tolist()
    [1.5, 1.5]
    """
    cap = np.ascontiguousarray(capacity_bps, dtype=np.float64)
    flow_of = np.ascontiguousarray(flow_of, dtype=np.int64)
    resource_of = np.ascontiguousarray(resource_of, dtype=np.int64)
    num_flows = int(num_flows)
    if flow_of.shape != resource_of.shape or flow_of.ndim != 1 or cap.ndim != 1:
        raise ValueError("max_min_rates: flow_of and resource_of must be 1-D and alike")
    if flow_of.size and (
        min(flow_of.min(), resource_of.min()) < 0
        or flow_of.max() >= num_flows
        or resource_of.max() >= cap.size
    ):  # the compiled loop does not check its indices
        raise ValueError("max_min_rates: a flow or resource id is out of range")
    return _progressive_filling(cap, flow_of, resource_of, num_flows)


@kernel
def _progressive_filling(cap, flow_of, resource_of, num_flows):
    """:func:`max_min_rates`' rounds. Each round: every resource with unfrozen flows offers
    ``left / count``; the least offer is the step every unfrozen flow rises by; each such
    resource pays ``count · step``; those whose offer was within 1e-12 of the step are full,
    and their unfrozen flows freeze (their entries leave every resource's count). A flow's rate
    is the running sum of the steps up to the round it froze in, added in round order (the
    same additions as raising every unfrozen flow by each step). Per round O(R), and each
    entry leaves its resource's count once."""
    n_res = cap.size
    n_ent = flow_of.size
    count = np.zeros(n_res, np.int64)
    flow_start = np.zeros(num_flows + 1, np.int64)
    for k in range(n_ent):
        count[resource_of[k]] += 1
        flow_start[flow_of[k] + 1] += 1
    res_start = np.zeros(n_res + 1, np.int64)
    for r in range(n_res):
        res_start[r + 1] = res_start[r] + count[r]
    for f in range(num_flows):
        flow_start[f + 1] += flow_start[f]
    res_entries = np.empty(n_ent, np.int64)  # entries by resource, then by flow
    flow_entries = np.empty(n_ent, np.int64)
    res_fill = res_start[:-1].copy()
    flow_fill = flow_start[:-1].copy()
    for k in range(n_ent):
        r = resource_of[k]
        res_entries[res_fill[r]] = k
        res_fill[r] += 1
        f = flow_of[k]
        flow_entries[flow_fill[f]] = k
        flow_fill[f] += 1
    live = np.ones(n_ent, np.bool_)
    active = np.ones(num_flows, np.bool_)
    rate = np.zeros(num_flows)
    left = cap.copy()
    share = np.empty(n_res)
    full = np.zeros(n_res, np.bool_)
    total = 0.0
    n_live = n_ent
    for _ in range(n_res + 1):
        if n_live == 0:
            break
        step = np.inf
        for r in range(n_res):
            if count[r] > 0:
                share[r] = left[r] / count[r]
                if share[r] < step:
                    step = share[r]
        total += step
        limit = step * (1.0 + 1e-12) + 1e-300
        for r in range(n_res):
            full[r] = False
            if count[r] > 0:
                left[r] -= count[r] * step
                full[r] = share[r] <= limit
        for r in range(n_res):
            if not full[r]:
                continue
            for i in range(res_start[r], res_start[r + 1]):
                k = res_entries[i]
                f = flow_of[k]
                if not live[k] or not active[f]:
                    continue
                active[f] = False
                rate[f] = total
                for j in range(flow_start[f], flow_start[f + 1]):
                    e = flow_entries[j]
                    if live[e]:
                        live[e] = False
                        count[resource_of[e]] -= 1
                        n_live -= 1
    for f in range(num_flows):
        if active[f]:
            rate[f] = total
    return rate


def _regions(cluster: Cluster) -> np.ndarray:
    """(D,) region id per device (region names in sorted order)."""
    return np.unique(np.asarray(cluster.region_of), return_inverse=True)[1].ravel()


def _region_bps(cluster: Cluster) -> np.ndarray:
    """(k, k) each region pair's bandwidth: the median of its device pairs' (inf: none)."""
    bw = cluster.bandwidth_bps
    region = _derived(cluster, "region")
    k = int(region.max()) + 1
    out = np.full((k, k), np.inf)
    for a in range(k):
        for b in range(k):
            block = bw[np.ix_(region == a, region == b)]
            block = block[np.isfinite(block)]
            if block.size:
                out[a, b] = float(np.median(block))
    return out


def _fastest_bps(cluster: Cluster) -> np.ndarray:
    """(D,) each device's fastest link."""
    bw = cluster.bandwidth_bps
    return np.where(np.isfinite(bw), bw, 0.0).max(axis=1)


def _tc_class(cluster: Cluster) -> np.ndarray:
    """(D, D) the ``tc_class`` class of every destination seen from every sender: the rank of
    its (delay, bandwidth) setting among the sender's distinct settings (both rounded to 1e-9),
    in (delay, bandwidth) order. That is what ``np.unique(..., axis=1, return_inverse=True)``
    gives row by row; here every row in one sort, or from :data:`CODED_CLASSES_FROM` devices
    through ids of the distinct values (:func:`_tc_class_coded`, the same classes). A subset
    of a fleet reads its classes off the fleet's instead (:func:`subset`)."""
    n = cluster.num_devices
    if n >= CODED_CLASSES_FROM:
        fast = _tc_class_coded(cluster)
        if fast is not None:
            return fast
    delay = np.round(cluster.delay_ms, 9).ravel()
    bw = np.round(cluster.bandwidth_gbps, 9).ravel()
    row = np.repeat(np.arange(n), n)
    order = np.lexsort((bw, delay, row))  # by sender, then delay, then bandwidth
    d, b, r = delay[order], bw[order], row[order]
    new = np.ones(n * n, dtype=bool)  # where a sender's next setting starts
    new[1:] = (r[1:] != r[:-1]) | (d[1:] != d[:-1]) | (b[1:] != b[:-1])
    seen = np.cumsum(new)
    rank = seen - np.repeat(seen[np.arange(n) * n], n)  # sender r's row starts at r·n
    out = np.empty(n * n, dtype=np.int64)
    out[order] = rank
    return out.reshape(n, n)


# From this many devices the classes are ranked through ids of the distinct values (one sort
# of each matrix's values, then O(n²) steps) rather than one sort of all n² (sender, delay,
# bandwidth) triples
CODED_CLASSES_FROM = 256


def _value_codes(values: np.ndarray) -> tuple[np.ndarray, int] | None:
    """Each entry's rank among the distinct values after rounding to 1e-9 (rounding is
    monotone, so the distinct raw values, rounded, give the same ranks as rounding every
    entry) and the number of distinct values; None when a NaN is among them."""
    raw = np.unique(values)
    if np.isnan(raw).any():
        return None
    rounded = np.round(raw, 9) + 0.0  # + 0.0: -0.0 and 0.0 are one value, as sorting has it
    _, rank = np.unique(rounded, return_inverse=True)
    return rank.ravel()[np.searchsorted(raw, values)], int(rank.max()) + 1


def _tc_class_coded(cluster: Cluster) -> np.ndarray | None:
    """:func:`_tc_class` through value ids: each (delay, bandwidth) setting's id in (delay,
    bandwidth) order, then ranked per sender among the ids its row holds (:func:`_row_ranks`).
    None where the ids would outgrow :data:`MAX_SETTINGS_RANKED` or a value is NaN (whose
    ranks only the sort defines)."""
    n = cluster.num_devices
    d = _value_codes(np.asarray(cluster.delay_ms, dtype=float).ravel())
    b = _value_codes(np.asarray(cluster.bandwidth_gbps, dtype=float).ravel())
    if d is None or b is None or d[1] * b[1] > MAX_SETTINGS_RANKED:
        return None
    setting = d[0].astype(np.int64) * b[1] + b[0]
    return _row_ranks(setting.reshape(n, n), d[1] * b[1])


# A subset ranks its classes off the fleet's (a table of devices × settings) while the fleet's
# senders see at most this many settings each
MAX_SETTINGS_RANKED = 1024


def _row_ranks(setting: np.ndarray, count: int) -> np.ndarray:
    """Per row, the rank of each entry's value among the row's distinct values, in value
    order: ``setting`` (rows, cols) ints in ``0..count-1``."""
    setting = np.ascontiguousarray(setting, dtype=np.int64)
    if setting.size and (setting.min() < 0 or setting.max() >= count):
        raise ValueError("_row_ranks: a value is out of 0..count-1")  # the loop reads unchecked
    return _row_ranks_kernel(setting, count)


@kernel
def _row_ranks_kernel(setting, count):
    """:func:`_row_ranks` row by row: mark the values the row holds, number the marked ones in
    value order, read each entry's number. O(rows · (cols + count))."""
    rows, cols = setting.shape
    out = np.empty((rows, cols), dtype=np.int64)
    mark = np.zeros(count, dtype=np.int64)  # the last row (+ 1) that held each value
    rank = np.zeros(count, dtype=np.int64)
    for i in range(rows):
        for j in range(cols):
            mark[setting[i, j]] = i + 1
        r = 0
        for v in range(count):
            if mark[v] == i + 1:
                rank[v] = r
                r += 1
        for j in range(cols):
            out[i, j] = rank[setting[i, j]]
    return out


def subset(cluster: Cluster, devices: Sequence[int], name: str | None = None) -> Cluster:
    """:meth:`Cluster.subset`, its ``tc_class`` classes read off the whole cluster's (a subset's
    links are the whole's: a sender's settings in the subset keep their order, so their ranks
    there are the ranks of the whole's ranks) instead of being worked out again. For a planner
    that simulates many subsets of one fleet."""
    sub = cluster.subset(devices, name=name)
    model = cluster.link_sharing
    if model is None or model.model != "tc_class":
        return sub
    key = (fingerprint(sub), "tc_class")
    if key not in _DERIVED:
        whole = _derived(cluster, "tc_class")
        count = int(whole.max()) + 1
        if count <= MAX_SETTINGS_RANKED:
            idx = np.asarray(devices, dtype=np.int64)
            _keep(key, _row_ranks(whole[np.ix_(idx, idx)], count))
    return sub


# What the models read off a cluster's links, each computed when a model first asks for it
_DERIVE = {
    "region": _regions,
    "region_bps": _region_bps,
    "fastest_bps": _fastest_bps,
    "tc_class": _tc_class,
}
# :data:`_DERIVE`'s values by the links they are computed from (the cluster's fingerprint) and
# name, so that the clusters of one case built apart (the jobs of a sweep) share them
_DERIVED: dict[tuple[str, str], np.ndarray] = {}
MAX_DERIVED = 64  # entries


def _derived(cluster: Cluster, part: str) -> np.ndarray:
    """``part`` (a :data:`_DERIVE` name) of ``cluster``, computed once per content; read-only."""
    key = (fingerprint(cluster), part)
    hit = _DERIVED.get(key)
    if hit is None:
        hit = _keep(key, _DERIVE[part](cluster))
    return hit


def _keep(key: tuple[str, str], value: np.ndarray) -> np.ndarray:
    """``value`` kept in :data:`_DERIVED` under ``key``, read-only."""
    value.setflags(write=False)
    if len(_DERIVED) >= MAX_DERIVED:
        _DERIVED.clear()
    _DERIVED[key] = value
    return value


def _compact(key: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense ids 0..K−1 of non-negative integer keys (first-seen order not kept) and K."""
    if key.size <= 32:  # a few flows (a pipeline boundary's TP ranks): the same ids, in Python
        vals = key.tolist()
        rank = {v: i for i, v in enumerate(sorted(set(vals)))}
        return np.array([rank[v] for v in vals], dtype=np.intp), len(rank)
    top = int(key.max()) + 1
    if top > 8 * key.size + 4096:  # keys spread wide (e.g. a million of 4,096² pair keys)
        distinct, code = np.unique(key, return_inverse=True)  # the same ids: sorted rank
        return code.ravel(), int(distinct.size)
    seen = np.zeros(top, dtype=bool)
    seen[key] = True
    code = np.cumsum(seen) - 1
    return code[key], int(seen.sum())


# Flow sets already allocated, by the cluster's fingerprint and the flows
# (:func:`shared_bandwidth_bps`): a grid search simulates hundreds of configurations whose rings
# and pipeline boundaries repeat the same flows, and so do the settings of one case.
_ALLOCATED: dict[tuple, np.ndarray] = {}
MAX_ALLOCATED = 1 << 15  # entries; each a few hundred bytes at 64 devices


def shared_bandwidth_bps(cluster: Cluster, src: Sequence[int], dst: Sequence[int]) -> np.ndarray:
    """Bandwidth (bit/s) each of the concurrent flows ``src[i] -> dst[i]`` gets under the
    cluster's link-sharing model (module docstring); ``inf`` for a device to itself.

    Each flow is capped by its pair; the model's other capacities (NICs, region pairs, classes)
    join the max-min allocation only where their flows' pair capacities add up to more than
    they hold — elsewhere they cannot bind and each pair splits equally among its flows.
    A pure function of the cluster and the flows: a flow set seen before is answered from
    :data:`_ALLOCATED` (a copy).
    """
    src, dst = np.asarray(src, dtype=int), np.asarray(dst, dtype=int)
    if src.shape != dst.shape:
        raise ValueError(f"flows: src {src.shape} and dst {dst.shape} differ in shape")
    sharing_of(cluster)  # a cluster without a model is refused, flows or not
    key = (fingerprint(cluster), src.shape, src.tobytes(), dst.tobytes())
    hit = _ALLOCATED.get(key)
    if hit is None:
        hit = _allocate(cluster, src, dst)
        if len(_ALLOCATED) >= MAX_ALLOCATED:
            _ALLOCATED.clear()
        _ALLOCATED[key] = hit
    return hit.copy()


def _pair_bps(cluster: Cluster, s: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Each flow's pair capacity: the pair's bandwidth, under ``flow`` that many sixteenths of
    it as the connection has sockets."""
    sharing = sharing_of(cluster)
    pair_bps = cluster.bandwidth_bps[s, d]
    if sharing.model == "flow":  # a connection of ``streams`` sockets gets that many sixteenths
        pair_bps = pair_bps * (sharing.streams / MEASURED_STREAMS)
    return pair_bps


def _caps(cluster: Cluster, s: np.ndarray, d: np.ndarray, pair_bps: np.ndarray):
    """The model's capacities besides the pairs (module docstring), for the moving flows
    ``s[i] -> d[i]``: per kind, (the flows it applies to, a function giving the key of each
    flow's capacity — flows of one key share it —, the capacity per flow)."""
    n, f = cluster.num_devices, s.size
    sharing = sharing_of(cluster)
    model = sharing.model
    every = np.ones(f, dtype=bool)
    single = cluster.host_nic_gbps is None  # one device per instance: device-level caps
    if not single:
        host = cluster.host_ids
        nic = np.asarray(cluster.host_nic_gbps) * 1e9
        cross = host[s] != host[d]
        yield cross, lambda: host[s], nic[host[s]]
        yield cross, lambda: host[d], nic[host[d]]
    if model == "pair":
        return
    region = _derived(cluster, "region")
    ra, rb = region[s], region[d]
    across = ra != rb
    if model == "nic" and single:
        nic = sharing.nic_gbps
        cap = _derived(cluster, "fastest_bps") if nic is None else np.full(n, nic * 1e9)
        yield every, lambda: s, cap[s]
        yield every, lambda: d, cap[d]
    if model == "region":
        k = int(region.max()) + 1
        yield across, lambda: ra * k + rb, _derived(cluster, "region_bps")[ra, rb]
    if model == "flow" and single:
        yield across, lambda: s, AWS_REGION_EGRESS_GBPS * 1e9
    if model in ("flow", "tc_class") and single:
        yield every, lambda: s, INSTANCE_GBPS * 1e9
        yield every, lambda: d, INSTANCE_GBPS * 1e9
    if model == "tc_class":
        yield every, lambda: s * n + _derived(cluster, "tc_class")[s, d], pair_bps


def alone_bps(cluster: Cluster, src: Sequence[int], dst: Sequence[int]) -> np.ndarray:
    """Bandwidth (bit/s) each flow ``src[i] -> dst[i]`` would get were it the only flow: what
    :func:`shared_bandwidth_bps` gives that flow on its own (its pair's capacity, or the least
    of the model's capacities below it by more than 1e-12, the ones that bind a lone flow),
    for many flows in one call; ``inf`` for a device to itself."""
    src, dst = np.asarray(src, dtype=int), np.asarray(dst, dtype=int)
    if src.shape != dst.shape:
        raise ValueError(f"flows: src {src.shape} and dst {dst.shape} differ in shape")
    out = np.full(src.shape, np.inf)
    moving = src != dst
    if not moving.any():
        return out
    s, d = src[moving], dst[moving]
    pair_bps = _pair_bps(cluster, s, d)
    rate = pair_bps
    for mask, _, cap_bps in _caps(cluster, s, d, pair_bps):
        cap = np.broadcast_to(np.asarray(cap_bps, dtype=float), (s.size,))
        binds = mask & (pair_bps > cap * (1.0 + 1e-12))
        rate = np.where(binds, np.minimum(rate, cap), rate)
    out[moving] = rate
    return out


def _allocate(cluster: Cluster, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """:func:`shared_bandwidth_bps` without the memo (``src``, ``dst`` int arrays, one shape)."""
    out = np.full(src.shape, np.inf)
    moving = src != dst
    if not moving.any():
        return out
    s, d = src[moving], dst[moving]
    n, f = cluster.num_devices, s.size
    pair_bps = _pair_bps(cluster, s, d)
    pair, n_pairs = _compact(s * n + d)
    pair_cap = np.zeros(n_pairs)
    pair_cap[pair] = pair_bps
    extra: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (flow ids, keys, capacities)

    def add(mask: np.ndarray, key: np.ndarray, cap_bps) -> None:
        """Capacities per distinct ``key`` of the flows in ``mask`` (``cap_bps`` per flow, the
        same for flows of one key), kept only where they can bind."""
        ids = np.flatnonzero(mask)
        if not ids.size:
            return
        inv, k = _compact(key[ids])
        cap = np.zeros(k)
        cap[inv] = np.broadcast_to(np.asarray(cap_bps, dtype=float), (f,))[ids]
        demand = np.bincount(inv, weights=pair_bps[ids], minlength=k)
        binds = demand > cap * (1.0 + 1e-12)
        if binds.any():
            keep = binds[inv]
            inv2, k2 = _compact(inv[keep])
            cap2 = np.zeros(k2)
            cap2[inv2] = cap[inv[keep]]
            extra.append((ids[keep], inv2, cap2))

    for mask, key, cap_bps in _caps(cluster, s, d, pair_bps):
        add(mask, key(), cap_bps)
    if not extra:  # nothing but the pairs binds: each pair splits equally among its flows
        out[moving] = pair_bps / np.bincount(pair)[pair]
        return out
    flow_of, resource_of, caps, offset = [np.arange(f)], [pair], [pair_cap], n_pairs
    for ids, inv, cap in extra:
        flow_of.append(ids)
        resource_of.append(inv + offset)
        caps.append(cap)
        offset += cap.size
    out[moving] = max_min_rates(
        np.concatenate(caps), np.concatenate(flow_of), np.concatenate(resource_of), f
    )
    return out
