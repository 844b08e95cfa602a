"""Lower bounds on the iteration time of any plan the planner can make.

A plan (:mod:`system.planner.search`) puts ``pp`` stages × ``dp`` replicas on ``pp·dp`` devices
of the fleet, micro-batches of ``b`` sequences, ``m = B / (dp·b)`` of them per replica; stage
``s`` holds ``l_s >= 1`` layers (``Σ l_s = L``) and runs at the slowest device of its group of
``dp`` devices; every pass is GPipe or 1F1B (one operation at a time per device, a micro-batch's
backward at stage ``s`` after its forward there and after its backward at ``s + 1``); after its
last backward a stage's devices exchange gradients in the sharded parameter server (paper §3.2,
:func:`system.simulator.collectives.sharded_ps_p2p_s`), then all devices all-reduce the fp16
overflow flag and take the optimizer step. The bound holds for every such plan whatever its
devices, placement, layer split, recomputation and schedule.

The bound is the least, over micro-batch sizes ``b`` and shapes ``(pp, dp)`` (every ``pp <= L``
and ``dp`` dividing ``B`` with ``pp·dp`` at most the fleet's devices, a superset of the shapes
the search builds, less those whose middle stage cannot hold ``⌈L / pp⌉`` layers on the
fleet's largest GPU even with one micro-batch and full recomputation), and over the cases
every placement falls in (:func:`placement_cases`: on a fleet of several regions, some
replica's pipeline crosses two regions, or every pipeline stays inside one), of the larger of
two terms, each argued in :func:`shape_terms_s`:

1. stage 0's last backward (after the busiest stage's ``m`` micro-batches and after the backward
   passes' flow shop over stages and links, stage groups as fast as the fleet's sorted rates
   allow), then its exchange, least over its group's spreads (:meth:`_Network.exchange_s`);
2. every stage's own compute, then its own exchange, its group drawn from the devices at least
   as fast as its slowest.

The case sharpens them: a pipeline that crosses regions has a link between regions in its
flow shop; pipelines that stay inside regions put as many devices of a region in every stage
group, so the fast stage groups are bounded by the regions' own GPU types and an exchange group
by the pipelines a region holds.

Not charged (so the bound holds for every placement): the flag all-reduce, the pipeline's sends
beyond one micro-batch's fill and the busiest link, the exchange of every stage but one (term
1) beyond its own compute (term 2), memory beyond the shape filter (recomputation it forces,
stages it forces onto larger GPUs), which GPU types each region has beyond term 2's
restriction and the ``inside`` case, and that stage groups share the regions' devices.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from system.simulator.hardware import (
    ADAM_BYTES_PER_PARAM,
    layer_forward_flops,
    logits_forward_flops,
)

__all__ = [
    "iteration_lower_bound_s",
    "shape_lower_bound_s",
    "placement_cases",
    "MAX_REGIONS_ENUMERATED",
]

GRADIENT_BYTES = 2  # fp16 gradients on the wire (system/workload.py Workload.gradient_bytes)
ACTIVATION_BYTES = 2  # fp16 activations on the wire (Workload.activation_bytes)
MAX_REGIONS_ENUMERATED = 12  # up to here every set of member regions is tried
_BISECTIONS = 200


def iteration_lower_bound_s(planner) -> float:
    """The bound (module docstring) of ``planner``'s problem, seconds. Each shape's terms
    without a placement case are below its every case's (a case only slows stage groups,
    lengthens link times or caps exchange groups), so shapes are taken in the order of
    those and the rest left once they reach the least found."""
    net = network_of(planner)
    base = sorted(
        (max(shape_terms_s(planner, pp, dp, b, net).values()), pp, dp, b)
        for pp, dp, b in _shapes(planner)
    )
    best = math.inf
    for low, pp, dp, b in base:
        if low >= best:
            break
        best = min(best, shape_lower_bound_s(planner, pp, dp, b, net))
    return float(best)


def _shapes(planner):
    model, n = planner.model, planner.cluster.num_devices
    most = float(np.max(planner.usable))
    for pp in range(1, min(model.num_layers, n) + 1):
        layers = -(-model.num_layers // pp)
        if planner.stage_memory(pp // 2 if pp > 2 else 0, pp, layers, 1, 1, "full") > most:
            continue  # a middle stage (the first when pp <= 2) cannot hold its layers
        for dp in range(1, n // pp + 1):
            if planner.batch % dp:
                continue
            for b in planner.micro_batch_sizes:
                if (planner.batch // dp) % b == 0:
                    yield pp, dp, b


def shape_lower_bound_s(planner, pp: int, dp: int, b: int, net=None) -> float:
    """For one shape and micro-batch size, the least over the placement cases
    (:func:`placement_cases`) of the larger of the two terms (module docstring)."""
    net = net if net is not None else network_of(planner)
    return min(
        max(shape_terms_s(planner, pp, dp, b, net, **case).values())
        for case in placement_cases(planner, pp, dp, b, net).values()
    )


def placement_cases(planner, pp: int, dp: int, b: int, net=None) -> dict[str, dict]:
    """The cases every placement of a shape falls in, each as :func:`shape_terms_s`'s keyword
    arguments: on a fleet of one region (or links the terms do not read per region) one case,
    ``any``; else ``crossing`` — some replica's pipeline crosses two regions — and ``inside``
    — every pipeline inside one region — where that is possible.

    ``crossing``: that replica's backward passes cross a link between regions once each, so
    that link is a machine of their flow shop (:func:`shape_terms_s`, term 1) taking at least
    ``Y / β_inter`` per message, ``β_inter`` the fastest link between two regions (at most
    the device cap): ``link_floor_s``.

    ``inside``: with ``n_R`` pipelines in region ``R`` (``n_R·pp`` of its ``A_R`` devices, so
    ``n_R <= ⌊A_R / pp⌋``, ``Σ n_R = dp``) every stage group holds exactly ``n_R`` devices of
    ``R``. Sorted by their slowest device, stage groups ``0..j`` then hold ``(j + 1)·n_R``
    devices of ``R`` at least as fast as group ``j``'s slowest, so that rate ``θ`` admits
    ``Σ_R min(⌊A_R / pp⌋, ⌊A_R(θ) / (j + 1)⌋) >= dp`` (``A_R(θ)`` the devices of ``R`` at
    least that fast): group ``j``'s slowest is at most the fastest rate that does (``slowest``,
    never above the sorted fleet's bound). And an exchange group holds at most ``⌊A_R / pp⌋``
    members of ``R`` (``region_caps``). Where ``Σ_R ⌊A_R / pp⌋ < dp`` every placement crosses."""
    net = net if net is not None else network_of(planner)
    if len(net.regions) < 2 or not net.regional:
        return {"any": {}}
    out = {}
    if pp > 1:  # a pipeline of one stage is one device: it crosses nothing
        act_bits = 8.0 * b * planner.model.seq_length * planner.model.hidden_size
        out["crossing"] = {"link_floor_s": act_bits * ACTIVATION_BYTES / net.inter_max_bps}
    caps = np.floor(net.avail / pp)
    if caps.sum() < dp:
        return out
    rates = np.asarray(planner._rates[b], dtype=float)
    levels = np.unique(rates)[::-1]  # fastest first
    # devices of each region at least as fast as each level: (levels, regions)
    at_least = np.stack([np.bincount(net._idx[rates >= th], minlength=len(caps)) for th in levels])
    slowest = np.zeros(pp)
    for j in range(pp):
        # the slowest level always admits: there ⌊A_R / (j + 1)⌋ >= ⌊A_R / pp⌋
        held = np.minimum(caps[None, :], np.floor(at_least / (j + 1))).sum(axis=1)
        slowest[j] = levels[np.flatnonzero(held >= dp)[0]]
    out["inside"] = {"slowest": slowest, "region_caps": caps}
    return out


def shape_terms_s(
    planner,
    pp: int,
    dp: int,
    b: int,
    net=None,
    *,
    slowest: np.ndarray | None = None,
    link_floor_s: float = 0.0,
    region_caps: np.ndarray | None = None,
) -> dict[str, float]:
    """The terms (module docstring) for one shape and micro-batch size, seconds: ``stage0``
    (stage 0's last backward), ``exchange0`` (its exchange and the optimizer step after it),
    ``term1`` (their sum), ``term2``. A placement case (:func:`placement_cases`) may bound
    each stage group's slowest rate further (``slowest``, fastest group first), a pipeline
    link's time per message (``link_floor_s``) and the members an exchange group holds in
    each region (``region_caps``).

    **Stage rates.** Let ``r_(k)`` be the ``k``-th largest rate (FLOP/s at micro-batch ``b``) in
    the fleet. Sorted from fastest, the ``j``-th stage's slowest device is at most
    ``r_((j+1)·dp)``: ``j + 1`` groups of ``dp`` devices each have their slowest device at least
    as fast, so ``(j + 1)·dp`` devices are. Stage ``j`` (in that order) takes at least
    ``t_j = l_j·c_j`` per micro-batch, ``c_j = 3·F(b) / r_((j+1)·dp)`` (``F(b)`` one layer's
    forward FLOPs; no recomputation, which only adds), its backward ``b_j >= 2/3·t_j``; the last
    stage also at least ``3·F_head(b) / r_(1)`` for the logits.

    **Term 1: stage 0's last backward, then its exchange.** With ``M = max t_s`` (one of the
    finitely many ``l·c_j``):

    - the busiest stage computes ``m·M`` before its last backward, and the stages before it
      then run that backward: stage 0 is done no earlier than ``m·M``;
    - the backward passes form a flow shop over the stages (and the links between machines):
      the first starts after one micro-batch's forward through every stage, and ``m`` jobs
      through machines of times ``p`` take at least ``Σ p + (m − 1)·max p`` (Johnson's
      flow-shop bound): stage 0 is done no earlier than ``G(M) + (m − 1)·max(2M/3, a)``,
      ``G(M)`` the least ``Σ t_s`` of a split with every ``t_s <= M`` (the layers to the
      fastest stages first, each stage at least one layer: exact) plus the logits, plus the
      messages of one micro-batch each way over the ``pp − 1`` boundaries: a message of
      ``b·seq·hidden`` fp16 values (``Y`` bits) takes at least the least delay ``α`` plus
      ``a = Y / β``, ``β`` the fastest link at most the device's cap ``κ``
      (:meth:`_Network.exchange_s`), and the ``k = ⌈pp / H⌉ − 1`` boundaries of each replica
      that must cross machines (``H`` the most GPUs on one machine) at least the least delay
      and the fastest link between machines; every link is a machine of the flow shop too
      (size-dependent links, where a fleet has them, are not charged);
    - then stage 0's exchange (:meth:`_Network.exchange_s`, shards of ``X = g·P_0 / dp`` bytes,
      ``g = 2`` fp16 bytes, ``P_0`` at least one layer's and the embeddings' parameters) and
      the optimizer step (at least one layer's Adam update at the fleet's fastest memory
      bandwidth).

    **Term 2: every stage's compute, then its exchange.** Stage ``j``'s slowest device runs at
    some rate ``θ <= r_((j+1)·dp)`` (one of the fleet's rates), and its group then holds only
    devices at least that fast; the stage ends its last backward no earlier than
    ``m·l_j·3F(b)/θ`` and then needs its exchange, at least ``l_j·τ_1(θ)`` (``τ_1(θ)`` the
    exchange bound for one layer's parameters, the embeddings left out, drawn from the devices
    at least as fast as ``θ``): ``T >= min over splits of max_j l_j·min_θ (3m·F(b)/θ +
    τ_1(θ))``, exact over integer splits.
    """
    net = net if net is not None else network_of(planner)
    model = planner.model
    total = int(model.num_layers)
    m = planner.batch // (dp * b)
    rates = np.sort(np.asarray(planner._rates[b], dtype=float))[::-1]
    fleet = rates[np.arange(1, pp + 1) * dp - 1]  # stage j's slowest device, at most
    slowest = fleet if slowest is None else np.minimum(fleet, slowest)
    f1 = layer_forward_flops(model, b)
    c = 3.0 * f1 / slowest  # seconds per layer per micro-batch, fastest stage first
    head = 3.0 * logits_forward_flops(model, b) / rates[0]
    # pipeline boundaries: every one at the fastest link (at most the device's cap), those
    # that must cross machines at the fastest link between machines
    cross = max(0, -(-pp // net.host_gpus) - 1)
    act_bits = 8.0 * b * model.seq_length * model.hidden_size * ACTIVATION_BYTES
    a_any = act_bits / net.any_bps if pp > 1 and net.any_bps > 0 else 0.0
    a_off = act_bits / net.off_bps if cross and net.off_bps > 0 else 0.0
    inside = pp - 1 - cross
    fill_links = 2.0 * (inside * (net.any_delay_s + a_any) + cross * (net.off_delay_s + a_off))
    a = max(a_any, a_off, link_floor_s)
    # term 1
    cand = np.unique((np.arange(1, total + 1)[:, None] * c[None, :]).ravel())
    caps = np.minimum(np.floor(cand[:, None] / c[None, :] * (1 + 1e-12)), total - pp + 1)
    ok = (caps >= 1).all(axis=1) & (caps.sum(axis=1) >= total)
    cand, caps = cand[ok], caps[ok]
    extra = caps - 1.0
    before = np.cumsum(extra, axis=1) - extra  # extra capacity of the faster stages
    taken = np.clip((total - pp) - before, 0.0, extra)
    g = ((1.0 + taken) * c[None, :]).sum(axis=1) + head
    flow = g + fill_links + (m - 1) * np.maximum(2.0 * cand / 3.0, a)
    stage0 = float(np.maximum(m * cand, flow).min())
    p0 = model.params_per_layer * (model.num_layers if pp == 1 else 1) + model.embedding_params
    opt0 = 8.0 * ADAM_BYTES_PER_PARAM * model.params_per_layer / net.hbm_max_bps
    exchange0 = net.exchange_s(dp, GRADIENT_BYTES * p0 / dp, caps=region_caps) + opt0
    # term 2
    # stage j's slowest device runs at some rate θ <= its bound, and its group then holds only
    # devices at least that fast: the exchange draws from those alone
    own = np.asarray(planner._rates[b], dtype=float)
    shard1 = GRADIENT_BYTES * model.params_per_layer / dp
    levels = np.unique(own)
    cost = np.array(
        [
            m * 3.0 * f1 / th + net.exchange_s(dp, shard1, False, own >= th, caps=region_caps)
            for th in levels
        ]
    )
    best_below = np.minimum.accumulate(cost)  # least cost over levels up to each
    per = best_below[np.searchsorted(levels, slowest, side="right") - 1]
    cand2 = np.unique((np.arange(1, total + 1)[:, None] * per[None, :]).ravel())
    caps2 = np.minimum(np.floor(cand2[:, None] / per[None, :] * (1 + 1e-12)), total)
    ok2 = caps2.sum(axis=1) >= total
    term2 = float(cand2[ok2].min()) if ok2.any() else math.inf
    return {
        "stage0": stage0,
        "exchange0": exchange0,
        "term1": stage0 + exchange0,
        "term2": term2,
    }


class _Network:
    """What the exchange and pipeline terms need of the fleet's links (:func:`shape_terms_s`,
    :meth:`exchange_s`)."""

    def __init__(self, cluster) -> None:
        from system.gpus import get_gpu
        from system.simulator.sharing import INSTANCE_GBPS, link_sharing_of

        host = cluster.host_ids
        region = np.asarray(cluster.region_of)
        self.host_gpus = int(np.bincount(host).max())
        bw, delay = np.asarray(cluster.bandwidth_bps), np.asarray(cluster.delay_s)
        # under ``flow`` a connection of more sockets than the pair figures' gets more
        self.pair_scale = pair_scale(cluster)
        if self.pair_scale != 1.0:
            bw = bw * self.pair_scale
        self.regions = sorted(set(region.tolist()))
        k = len(self.regions)
        idx = np.unique(region, return_inverse=True)[1].ravel()  # sorted names: self.regions
        self._idx, self._host = idx, host
        self.avail = np.bincount(idx, minlength=k).astype(float)
        self.region_host_gpus = np.zeros(k)
        self.intra_bps = np.zeros(k)  # fastest link between two machines of one region
        self.inter_bps = np.zeros((k, k))  # β_RR', the fastest device pair (uniform: checked)
        off_bw, off_delay, host_bw, host_delay = 0.0, math.inf, 0.0, math.inf
        uniform = True
        members = [np.flatnonzero(idx == r) for r in range(k)]
        for r in range(k):
            rows = members[r]
            self.region_host_gpus[r] = np.bincount(host[rows]).max()
            for q in range(k):
                cols = members[q]
                sub_bw, sub_delay = bw[np.ix_(rows, cols)], delay[np.ix_(rows, cols)]
                if q != r and not np.intersect1d(host[rows], host[cols]).size:
                    vals, dels = sub_bw.ravel(), sub_delay.ravel()  # every pair off-machine
                else:
                    sub_off = host[rows][:, None] != host[cols][None, :]
                    if q == r:  # pairs of one machine, a device to itself left out
                        same = ~sub_off & (rows[:, None] != cols[None, :])
                        if same.any():
                            host_bw = max(host_bw, float(sub_bw[same].max()))
                            host_delay = min(host_delay, float(sub_delay[same].min()))
                    if not sub_off.any():
                        continue
                    vals, dels = sub_bw[sub_off], sub_delay[sub_off]
                if np.ptp(vals) > 0 or np.ptp(dels) > 0:
                    uniform = False
                off_bw, off_delay = max(off_bw, float(vals.max())), min(off_delay, dels.min())
                if q == r:
                    self.intra_bps[r] = float(vals.max())
                else:
                    self.inter_bps[r, q] = float(vals.max())
        self.off_bw_bps = off_bw
        self.off_delay_s = float(off_delay) if off_bw > 0 else 0.0
        self.host_bps = host_bw if host_bw > 0 else math.inf
        # a device's cap on all its flows together: the instance NIC under tc_class and flow
        # where devices are their own instances (system/simulator/sharing.py)
        sharing = self.sharing = link_sharing_of(cluster)
        single = cluster.host_nic_gbps is None and sharing in ("tc_class", "flow")
        self.cap_bps = INSTANCE_GBPS * 1e9 if single else math.inf
        plain = cluster.links is None  # flat α-β links (size-dependent fits: not charged)
        fastest = max(off_bw, host_bw)
        self.any_bps = min(fastest, self.cap_bps) if plain and fastest > 0 else 0.0
        self.any_delay_s = float(min(off_delay, host_delay)) if plain and fastest > 0 else 0.0
        self.off_bps = min(self.off_bw_bps, self.cap_bps) if plain else 0.0
        if not plain:
            self.off_delay_s = 0.0
        self.hbm_max_bps = max(get_gpu(g).hbm_bandwidth_bps for g in cluster.gpus)
        self.tc_class = sharing == "tc_class" and plain and uniform
        # the placement cases (:func:`placement_cases`) read regions: flat links, every
        # machine in one region, some link between regions; a message between two regions
        # then runs at most at the fastest such link, and the device cap
        one_region = np.unique(np.stack([host, idx]), axis=1).shape[1] == np.unique(host).size
        self.inter_max_bps = min(float(self.inter_bps.max()), self.cap_bps) if k > 1 else 0.0
        self.regional = plain and one_region and self.inter_max_bps > 0
        self._u: dict[tuple, float] = {}

    def exchange_s(
        self,
        dp: int,
        shard_bytes: float,
        delay: bool = True,
        keep: np.ndarray | None = None,
        *,
        caps: np.ndarray | None = None,
    ) -> float:
        """The least time from a stage's last backward to its exchange's end, seconds, for a
        group of ``dp`` devices exchanging shards of ``X = shard_bytes``, drawn from the
        devices ``keep`` (a boolean mask; all when None), at most ``caps[R]`` of them in
        region ``R`` (none when None).

        Every member ``j`` sends each other member ``i`` its shard and, on the same connection
        after it, its reduced shard, so ``i`` is done no earlier than ``e_j + α + 2·8X /
        ρ_ji``, ``ρ_ji`` the flow's rate. Under ``tc_class`` (:mod:`system.simulator.sharing`) a
        sender's flows to the devices of one region (one (delay, bandwidth) setting where
        links are set per region pair, checked) share at most that pair's bandwidth
        ``β_RR'``; so with ``c_R`` members in region ``R``, ``T >= e + 16X·c_R' / β_RR'`` for
        every member regions ``R ≠ R'``, and ``T >= e + 16X·(c_R − H_R) / β_R`` for the
        members of one region on other machines (``H_R`` the most GPUs on one of its
        machines, ``β_R`` the fastest link between two of its machines). The least over every
        distribution ``c`` (a sum of ``dp``, at most the region's devices; relaxed to real
        numbers) and every set of member regions (all 2^regions, or one relaxation past
        :data:`MAX_REGIONS_ENUMERATED`) is found by bisection (:meth:`min_peers_per_bps`); it
        scales with ``X``. Under the other link-sharing models only one flow's ``α + 2·8X /
        β_max`` is charged (a pair is capped at its β by every model). Wherever the group
        sits, a member sends ``2·(dp − 1)`` shards within its cap ``κ``: at least
        ``16X·(dp − 1) / κ``. The cap: under ``tc_class`` and ``flow`` with no host NIC given,
        the instance NIC :data:`system.simulator.sharing.INSTANCE_GBPS` caps all of a
        device's flows, those inside a machine too; none otherwise."""
        if dp <= 1:
            return 0.0
        # every member sends its dp − 1 peers two shards each within its own cap
        capped = 16.0 * shard_bytes * (dp - 1) / self.cap_bps
        if dp <= self.host_gpus or self.off_bw_bps <= 0:
            return capped  # the group may sit on one machine
        alpha = self.off_delay_s if delay else 0.0
        one_flow = alpha + 16.0 * shard_bytes / self.off_bw_bps
        if not self.tc_class:
            return max(capped, one_flow)
        u = self.min_peers_per_bps(dp, keep, caps)
        return max(capped, one_flow, alpha + 16.0 * shard_bytes * u)

    def group_per_byte(self, group: np.ndarray) -> float:
        """The largest ``16·n_σ / β_σ`` (s per shard byte) over the senders of one stage
        group and the classes of their destinations, classes per region (another region's
        devices; this region's other machines; this machine), each class's rate capped by the
        device cap."""
        reg, hst = self._idx[group], self._host[group]
        k = len(self.regions)
        count = np.bincount(reg, minlength=k).astype(float)
        present = np.flatnonzero(count)
        best = 0.0
        if present.size > 1:
            inter = np.minimum(self.inter_bps[np.ix_(present, present)], self.cap_bps)
            n = np.broadcast_to(count[present][None, :], inter.shape)
            ratio = np.where(inter > 0, n / np.where(inter > 0, inter, 1.0), 0.0)
            np.fill_diagonal(ratio, 0.0)
            best = float(ratio.max())
        per_host = np.unique(hst, return_counts=True)[1]
        for r in present:
            on = reg == r
            fewest = np.unique(hst[on], return_counts=True)[1].min()
            others = count[r] - fewest  # peers of a member of the emptiest machine, off it
            if others > 0 and self.intra_bps[r] > 0:
                best = max(best, others / min(self.intra_bps[r], self.cap_bps))
        if per_host.max() > 1:
            best = max(best, (per_host.max() - 1) / min(self.host_bps, self.cap_bps))
        return 16.0 * best

    def min_peers_per_bps(
        self, dp: int, keep: np.ndarray | None = None, caps: np.ndarray | None = None
    ) -> float:
        """The least ``u`` (s/bit) such that ``dp`` devices of ``keep`` fit the regions with at
        most ``u·β_RR'`` members in each member region ``R'`` per other member region ``R``,
        and at most ``H_R + u·β_R`` in a region itself: the exchange then takes at least
        ``16X·u``. Every set of member regions at once, by bisection (``lo`` never fits, so it
        is a lower bound on the least ``u``)."""
        key = (dp, *(None if x is None else x.tobytes() for x in (keep, caps)))
        if key not in self._u:
            if keep is None:
                avail, hosts = self.avail, self.region_host_gpus
            else:
                k = len(self.regions)
                avail = np.bincount(self._idx[keep], minlength=k).astype(float)
                hosts = np.zeros(k)
                for r in np.flatnonzero(avail):
                    hosts[r] = np.bincount(self._host[keep & (self._idx == r)]).max()
            if caps is not None:  # at most caps[R] members in region R
                avail = np.minimum(avail, caps)
            self._u[key] = self._least_u(dp, avail, hosts)
        return self._u[key]

    def _least_u(self, dp: int, avail_all: np.ndarray, hosts: np.ndarray) -> float:
        k = len(self.regions)
        if k <= MAX_REGIONS_ENUMERATED:
            member = np.array(list(itertools.product((False, True), repeat=k))[1:], dtype=bool)
            inter = np.where(member[:, :, None], self.inter_bps[None], np.inf)  # [S, R, R']
            inter[:, np.arange(k), np.arange(k)] = np.inf
            inbound = inter.min(axis=1)  # the slowest member region's link into R'
        else:  # each region alone, and all with the fastest other region's link into R'
            member = np.vstack([np.eye(k, dtype=bool), np.ones((1, k), dtype=bool)])
            inbound = np.vstack([np.full((k, k), np.inf), self.inter_bps.max(axis=0)[None]])
        avail = np.where(member, avail_all[None], 0.0)
        base, intra = hosts[None], self.intra_bps[None]
        alone = np.isinf(inbound)  # no other member region sends into R'
        inbound = np.where(alone, 0.0, inbound)

        def fits(u: np.ndarray) -> np.ndarray:
            u = u[:, None]
            cap = np.minimum(avail, base + u * intra)
            cap = np.minimum(cap, np.where(alone, np.inf, u * inbound))
            return cap.sum(axis=1) >= dp

        s = member.shape[0]
        if not fits(np.full(s, 1e6)).any():
            return math.inf  # too few devices
        if fits(np.zeros(s)).any():
            return 0.0
        lo, hi = np.zeros(s), np.full(s, 1e6)
        for _ in range(_BISECTIONS):
            mid = 0.5 * (lo + hi)
            ok = fits(mid)
            hi, lo = np.where(ok, mid, hi), np.where(ok, lo, mid)
        feasible = fits(np.full(s, 1e6))
        return float(lo[feasible].min())


def layout_exchange_terms(planner, stages: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per stage of one layout: ``(α_s, k_s)`` such that its exchange of ``X`` bytes per shard
    ends no earlier than ``α_s + k_s·X`` after its devices' last backward (0, 0 when dp = 1 or
    the fleet's links are size-dependent).

    Every pair ``j -> i`` of a stage group carries the shard and then the reduced shard, so
    ``i`` is done no earlier than ``e_j + α_ji + 2·8X / ρ_ji``; ``ρ_ji`` is at most the pair's
    bandwidth, at most ``β_σ / n_σ`` for the slowest of the ``n_σ`` flows ``j`` sends in one
    ``tc_class`` class ``σ`` (one (delay, bandwidth) setting, :mod:`system.simulator.sharing`),
    and at most ``κ / (dp − 1)`` for the slowest of all ``j``'s flows under a device cap ``κ``
    (:meth:`_Network.exchange_s`). ``α_s`` is the least delay between two devices of the fleet.
    Where links are set per region pair (:class:`_Network`), a class is counted per region of
    the destinations (a sender's destinations in another region share one setting; two
    regions of one setting would share more), in ``O(dp)``; elsewhere per pair, in
    ``O(dp²)``, and past :data:`MAX_DENSE_GROUP` members only the cap is charged."""
    from system.simulator.sharing import _derived

    cluster = planner.cluster
    pp, dp = stages.shape
    alpha, k = np.zeros(pp), np.zeros(pp)
    if dp == 1 or cluster.links is not None:
        return alpha, k
    net = network_of(planner)
    alpha[:] = net.any_delay_s
    k[:] = 16.0 * (dp - 1) / net.cap_bps
    if net.tc_class:
        for s in range(pp):
            k[s] = max(k[s], net.group_per_byte(stages[s]))
        return alpha, k
    if dp > MAX_DENSE_GROUP:
        return alpha, k
    sharing_tc = net.sharing == "tc_class"
    cls_all = _derived(cluster, "tc_class") if sharing_tc else None
    off = ~np.eye(dp, dtype=bool)
    for s in range(pp):
        g = stages[s]
        bw = np.minimum(cluster.bandwidth_bps[np.ix_(g, g)] * net.pair_scale, net.cap_bps)
        per_byte = max(k[s], float((16.0 / bw[off]).max()))  # one flow alone
        if cls_all is not None:
            cls = cls_all[np.ix_(g, g)]
            width = int(cls.max()) + 1
            rows = np.repeat(np.arange(dp), dp).reshape(dp, dp)
            key = (rows * width + cls)[off]
            n = np.bincount(key, minlength=dp * width)
            rate = np.zeros(dp * width)
            rate[key] = cluster.bandwidth_bps[np.ix_(g, g)][off]  # one setting per class
            used = n > 0
            per_byte = max(per_byte, float((16.0 * n[used] / rate[used]).max()))
        k[s] = per_byte
    return alpha, k


MAX_DENSE_GROUP = 256  # members: past this a group's pairs are not enumerated


def pair_scale(cluster) -> float:
    """How far above its bandwidth one pair's connection can run: ``streams / 16`` under
    ``flow`` with more sockets than the pair figures were measured with, else 1."""
    from system.simulator.sharing import MEASURED_STREAMS, sharing_of

    model = sharing_of(cluster)
    if model.model == "flow":
        return max(1.0, model.streams / MEASURED_STREAMS)
    return 1.0


def network_of(planner) -> _Network:
    """The planner's fleet as the bounds read it, built once per planner."""
    net = getattr(planner, "_bound_network", None)
    if net is None:
        net = planner._bound_network = _Network(planner.cluster)
    return net
