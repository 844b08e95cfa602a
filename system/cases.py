"""The five network cases of the paper (§4.1), a small ``debug`` case, and user topologies.

Cases use the paper's numbering on the command line (``case=5``). Every bandwidth is Gbit/s and
every delay is a one-way latency in ms (see :mod:`system.cluster` for the delay semantics).

Two variants:

- ``paper`` (default): the numbers the paper states, unit-correct.
- ``dtfm_code``: what the authors' code used instead (the scheduler's link matrices, DS3Lab/DT-FM
  ``scheduler/generate_sim_com_matrices.py``) — 10 ms inside a region (their tc value) in cases
  4–5; 5 Gbit/s and 1 ms inside a campus and 11 ms across in case 3; and in cases 1–2 the links
  between hosts at the GB/s figures read as Gbit/s (the unit bug, i.e. 8× too low), while the
  links inside a host carry the value 100 of their matrices in both cases. Offered only so their
  numbers can be compared.

User topologies: :func:`cluster_from_files` reads a pair table (CSV or YAML: region_a, region_b,
delay_ms, bandwidth_gbps, plus optional ``intra`` rows with region_a == region_b) and a
device-to-region list; :func:`load_topology` reads one YAML/JSON file. A topology file's results
depend on its content, not its name: :func:`case_digest` is the SHA-256 of the bytes a case was
read from, and every results row of a file case carries it in its key (``case_sha256``), so an
edited file gets new rows instead of the old file's.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from importlib import resources
from pathlib import Path

import numpy as np

from system.cluster import Cluster, LinkSharing
from system.limits import check_devices

__all__ = [
    "CASES",
    "VARIANTS",
    "get_case",
    "cluster_from_regions",
    "cluster_from_files",
    "read_pair_table",
    "spot_cluster",
    "case_names",
    "canonical_case",
    "load_topology",
    "case_digest",
    "case_label",
    "is_topology_file",
    "PAPER_CASES",
    "ALIASES",
]

VARIANTS = ("paper", "dtfm_code")
PairTable = dict[frozenset[str], tuple[float, float]]  # {a, b} -> (delay_ms, bandwidth_gbps)

# Region order of cases 4 and 5 as the paper lists them; devices are numbered region by region.
CASE4_REGIONS = ("Virginia", "Oregon", "California", "Ohio")
CASE5_REGIONS = ("Oregon", "Virginia", "Ohio", "Tokyo", "Seoul", "London", "Frankfurt", "Ireland")
DEBUG_REGIONS = ("Oregon", "Virginia", "Tokyo", "Frankfurt")

NVLINK_GBPS = (
    1200.0  # V100 NVLink, 300 GB/s aggregate = 150 GB/s per direction (NVIDIA V100 datasheet)
)
DTFM_INTRA_HOST = 100.0  # the authors' matrices: 100 (read as Gbit/s) inside a host, cases 1-2


def read_pair_table(path: str | Path) -> PairTable:
    """Read region pairs from CSV or YAML/JSON rows with region_a, region_b, delay_ms,
    bandwidth_gbps."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"pair table {path} does not exist")
    if path.suffix.lower() in TOPOLOGY_SUFFIXES:
        data = parse_document(path.read_bytes(), f"pair table {path}", json_only=_is_json(path))
        rows = data["pairs"] if isinstance(data, dict) and "pairs" in data else data
    else:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    return _pairs_from_rows(rows, str(path))


# Topology and pair-table files are read with these limits: a YAML alias is refused (nested
# aliases expand exponentially, the "billion laughs" document), a tag other than YAML's own
# (``!!python/object``) is refused by the safe loader, and a file over this size is refused before
# it is parsed.
MAX_DOCUMENT_BYTES = 8 * 2**20
TOPOLOGY_SUFFIXES = (".yaml", ".yml", ".json")


def _no_alias_loader():
    import yaml  # PyYAML arrives with hydra-core/omegaconf

    class NoAliasLoader(yaml.SafeLoader):
        """The safe loader, refusing aliases (``*name``) where it composes a node."""

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise yaml.composer.ComposerError(
                    None, None, f"alias *{event.anchor} is not allowed", event.start_mark
                )
            return super().compose_node(parent, index)

    return NoAliasLoader


def _yaml_problem(e) -> str:
    """One line from a PyYAML error: its problem and where (line, column, 1-based)."""
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    what = getattr(e, "problem", None) or str(e).splitlines()[0]
    return " ".join(str(what).split()) + where


def _is_json(path: Path) -> bool:
    return path.suffix.lower() == ".json"


def parse_document(raw: bytes, where: str, *, json_only: bool = False):
    """The YAML (or, ``json_only``, JSON) document in ``raw``, or a one-line ValueError naming
    ``where``: over :data:`MAX_DOCUMENT_BYTES`, not UTF-8, malformed, a YAML alias or a tag
    that is not YAML's own (``!!python/...``, ``!custom``), or nested too deeply."""
    import yaml  # PyYAML arrives with hydra-core/omegaconf

    if len(raw) > MAX_DOCUMENT_BYTES:
        raise ValueError(f"{where}: {len(raw)} bytes, more than the {MAX_DOCUMENT_BYTES} allowed")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{where}: not UTF-8 text (byte {e.start})") from None
    try:
        if json_only:
            return json.loads(text)
        loader = _no_alias_loader()(text)  # the safe loader, composing without aliases
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{where}: not a valid YAML document ({_yaml_problem(e)})") from None
    except RecursionError:
        raise ValueError(f"{where}: nested too deeply") from None


def _number(value, column: str, where: str, n: int) -> float:
    """A finite number from a table cell; booleans and text that is not a number are errors."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{where}: row {n}: {column}={value!r} is not a number")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: row {n}: {column}={value!r} is not a number") from None


def _pairs_from_rows(rows: Sequence[dict], where: str) -> PairTable:
    table: PairTable = {}
    need = ("region_a", "region_b", "delay_ms", "bandwidth_gbps")
    if not isinstance(rows, (list, tuple)):
        raise ValueError(f"{where}: expected a list of pair rows, got {type(rows).__name__}")
    for n, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            raise ValueError(f"{where}: row {n} is not a mapping of {', '.join(need)}")
        if None in row:  # csv.DictReader files cells beyond the header under None
            raise ValueError(f"{where}: row {n} has more cells than the header ({row[None]})")
        missing = [k for k in need if k not in row]
        if missing:
            raise ValueError(f"{where}: row {n} lacks column(s) {missing}")
        extra = sorted(set(row) - set(need))
        if extra:
            raise ValueError(f"{where}: row {n} has unknown column(s) {extra}; known: {list(need)}")
        delay = _number(row["delay_ms"], "delay_ms", where, n)
        bw = _number(row["bandwidth_gbps"], "bandwidth_gbps", where, n)
        if not (np.isfinite(delay) and delay >= 0 and np.isfinite(bw) and bw > 0):
            raise ValueError(f"{where}: row {n}: need delay_ms >= 0 and bandwidth_gbps > 0")
        key = frozenset((str(row["region_a"]), str(row["region_b"])))
        if key in table and table[key] != (delay, bw):
            raise ValueError(
                f"{where}: row {n}: pair {sorted(key)} given twice with different values"
            )
        table[key] = (delay, bw)
    return table


def _packaged_table(name: str) -> PairTable:
    text = resources.files("system.data").joinpath(name).read_text()
    return _pairs_from_rows(list(csv.DictReader(text.splitlines())), name)


def cluster_from_regions(
    name: str,
    region_of: Sequence[str],
    pairs: PairTable,
    *,
    intra_delay_ms: float | None = None,
    intra_bandwidth_gbps: float | None = None,
    host_of: Sequence[int] | None = None,
    intra_host_delay_ms: float = 0.0,
    intra_host_bandwidth_gbps: float | None = None,
    host_nic_gbps: Sequence[float] | None = None,
    gpu_of: Sequence[str] | None = None,
    description: str = "",
    meta: dict | None = None,
) -> Cluster:
    """Build a cluster from a region per device and a region-pair table.

    Links between two regions take the pair's values; links inside a region take the table's
    ``{r}`` row if present, else ``intra_delay_ms``/``intra_bandwidth_gbps``; links between two
    devices of one host take ``intra_host_*`` (when given).
    """
    d = len(region_of)
    delay = np.zeros((d, d))
    bw = np.full((d, d), np.inf)
    regions = list(dict.fromkeys(region_of))
    index = {r: [i for i, x in enumerate(region_of) if x == r] for r in regions}
    for a in regions:
        for b in regions:
            key = frozenset((a, b))
            if key in pairs:
                dl, b_ = pairs[key]
            elif a == b and intra_delay_ms is not None and intra_bandwidth_gbps is not None:
                dl, b_ = intra_delay_ms, intra_bandwidth_gbps
            elif a == b and len(index[a]) == 1:
                continue
            else:
                raise ValueError(f"cluster {name!r}: no link values for regions {a!r} and {b!r}")
            ia, ib = np.array(index[a]), np.array(index[b])
            delay[np.ix_(ia, ib)] = dl
            bw[np.ix_(ia, ib)] = b_
    hosts = tuple(range(d)) if host_of is None else tuple(host_of)
    if intra_host_bandwidth_gbps is not None:
        same = np.equal.outer(np.array(hosts), np.array(hosts))
        delay[same] = intra_host_delay_ms
        bw[same] = intra_host_bandwidth_gbps
    return Cluster(
        name=name,
        region_of=tuple(region_of),
        host_of=hosts,
        delay_ms=delay,
        bandwidth_gbps=bw,
        host_nic_gbps=None if host_nic_gbps is None else tuple(host_nic_gbps),
        gpu_of=None if gpu_of is None else tuple(gpu_of),
        description=description,
        meta=meta or {},
    )


def cluster_from_files(
    pairs_path: str | Path,
    devices: str | Path | Sequence[str],
    *,
    name: str | None = None,
    intra_delay_ms: float | None = None,
    intra_bandwidth_gbps: float | None = None,
) -> Cluster:
    """A user topology: pair table file + device-to-region list (a list, or a file, one per line).

    A device file may also be CSV with columns ``region`` and optionally ``host`` and ``gpu`` (a
    :data:`system.gpus.GPU_TYPES` name per device; absent: V100).
    """
    pairs = read_pair_table(pairs_path)
    host_of = gpu_of = None
    if isinstance(devices, (str, Path)):
        p = Path(devices)
        if not p.exists():
            raise FileNotFoundError(f"device list {p} does not exist")
        lines = [
            ln.strip() for ln in p.read_text().splitlines() if ln.strip() and not ln.startswith("#")
        ]
        if lines and "region" in lines[0].split(","):
            rows = list(csv.DictReader(lines))
            region_of = [r["region"] for r in rows]
            if "host" in rows[0]:
                host_of = [int(r["host"]) for r in rows]
            if "gpu" in rows[0]:
                gpu_of = [r["gpu"] for r in rows]
        else:
            region_of = lines
    else:
        region_of = list(devices)
    if not region_of:
        raise ValueError("device list is empty")
    return cluster_from_regions(
        name or Path(str(pairs_path)).stem,
        region_of,
        pairs,
        intra_delay_ms=intra_delay_ms,
        intra_bandwidth_gbps=intra_bandwidth_gbps,
        host_of=host_of,
        gpu_of=gpu_of,
        meta={"source": str(pairs_path)},
    )


# ---- the paper's cases -----------------------------------------------------------------------


def _meta(case: str, variant: str) -> dict:
    return {"case": case, "variant": variant}


def case1(variant: str = "paper") -> Cluster:
    """Case 1, data center on demand (§4.1): 8 hosts × 8 V100, NVLink inside, 25 Gbit/s across."""
    unit = 8.0 if variant == "dtfm_code" else 1.0  # their GB/s numbers read as Gbit/s
    return cluster_from_regions(
        "case1-datacenter-on-demand",
        ["dc"] * 64,
        {frozenset(("dc",)): (0.0, 25.0 / unit)},
        host_of=[d // 8 for d in range(64)],
        intra_host_bandwidth_gbps=DTFM_INTRA_HOST if variant == "dtfm_code" else NVLINK_GBPS,
        host_nic_gbps=[25.0 / unit] * 8,
        description="8 x p3.16xlarge: NVLink inside a host, 25 Gbit/s between hosts",
        meta=_meta("1", variant),
    )


def case2(variant: str = "paper") -> Cluster:
    """Case 2, data center spot (§4.1): 8 hosts × 4 GPUs + 32 hosts × 1 GPU, 10 Gbit/s across.

    The paper's instance count (4 × p3.8xlarge + 32 × p3.2xlarge) gives 48 GPUs; we follow the
    authors' code layout that gives 64.
    """
    unit = 8.0 if variant == "dtfm_code" else 1.0
    return spot_cluster(
        "case2-datacenter-spot",
        host_sizes=(4,) * 8 + (1,) * 32,
        across_gbps=10.0 / unit,
        inside_gbps=DTFM_INTRA_HOST if variant == "dtfm_code" else 100.0,
        meta=_meta("2", variant),
    )


def spot_cluster(
    name: str,
    *,
    host_sizes: Sequence[int],
    across_gbps: float,
    inside_gbps: float,
    across_delay_ms: float = 0.0,
    meta: dict | None = None,
) -> Cluster:
    """One data center of hosts with ``host_sizes`` GPUs each (case 2's shape and its variants).

    Devices are numbered host by host; links inside a host run at ``inside_gbps`` with no delay,
    links between hosts at ``across_gbps`` / ``across_delay_ms``, each host has one NIC of
    ``across_gbps``.
    """
    host_sizes = tuple(int(k) for k in host_sizes)
    if not host_sizes or min(host_sizes) < 1:
        raise ValueError(f"spot cluster {name!r}: host_sizes must be positive, got {host_sizes}")
    hosts = [h for h, k in enumerate(host_sizes) for _ in range(k)]
    big = [k for k in host_sizes if k > 1]
    shape = " + ".join(
        f"{n} hosts x {k} GPUs"
        for k, n in sorted(((k, host_sizes.count(k)) for k in set(host_sizes)), reverse=True)
    )
    return cluster_from_regions(
        name,
        ["dc"] * len(hosts),
        {frozenset(("dc",)): (across_delay_ms, across_gbps)},
        host_of=hosts,
        intra_host_bandwidth_gbps=inside_gbps if big else None,
        host_nic_gbps=[across_gbps] * len(host_sizes),
        description=f"{shape}; {inside_gbps:g} Gbit/s inside a host, {across_gbps:g} across",
        meta=meta or {},
    )


def case3(variant: str = "paper") -> Cluster:
    """Case 3, two campuses (§4.1): 32 GPUs in Ohio + 32 in Virginia, 10 ms / 1.12 Gbit/s across."""
    if variant == "dtfm_code":
        intra, across = (1.0, 5.0), (11.0, 1.12)
    else:
        intra, across = (0.0, 10.0), (10.0, 1.12)
    return cluster_from_regions(
        "case3-two-campuses",
        ["Ohio"] * 32 + ["Virginia"] * 32,
        {
            frozenset(("Ohio",)): intra,
            frozenset(("Virginia",)): intra,
            frozenset(("Ohio", "Virginia")): across,
        },
        description="two campuses joined by a 1.12 Gbit/s link",
        meta=_meta("3", variant),
    )


def _regional(
    name: str,
    regions: Sequence[str],
    per_region: int,
    table: str,
    variant: str,
    case: str,
    description: str,
) -> Cluster:
    intra_ms = 10.0 if variant == "dtfm_code" else 5.0
    return cluster_from_regions(
        name,
        [r for r in regions for _ in range(per_region)],
        _packaged_table(table),
        intra_delay_ms=intra_ms,
        intra_bandwidth_gbps=2.0,
        description=description,
        meta=_meta(case, variant),
    )


def case4(variant: str = "paper") -> Cluster:
    """Case 4, regional geo-distributed (§4.1): 16 GPUs in each of 4 US regions."""
    return _regional(
        "case4-regional",
        CASE4_REGIONS,
        16,
        "aws_region_pairs_case4.csv",
        variant,
        "4",
        "4 US regions x 16 GPUs, 5 ms / 2 Gbit/s inside a region",
    )


def case5(variant: str = "paper") -> Cluster:
    """Case 5, worldwide geo-distributed (§4.1): 8 GPUs in each of 8 regions on 4 continents."""
    return _regional(
        "case5-worldwide",
        CASE5_REGIONS,
        8,
        "aws_region_pairs_case5.csv",
        variant,
        "5",
        "8 regions x 8 GPUs, 5 ms / 2 Gbit/s inside a region",
    )


def debug(variant: str = "paper") -> Cluster:
    """Debug case: 8 devices, 2 in each of 4 worldwide regions (case-5 links); fast tests."""
    return _regional(
        "debug",
        DEBUG_REGIONS,
        2,
        "aws_region_pairs_case5.csv",
        variant,
        "debug",
        "4 worldwide regions x 2 devices",
    )


# Mixed fleet: (region, GPU type, hosts, GPUs per host, Gbit/s inside a host). Instance shapes
# are the public cloud ones (AWS p4d.24xlarge: 8 A100 on NVLink, 600 GB/s per GPU; p3.16xlarge:
# 8 V100 on NVLink; g4dn.12xlarge: 4 T4 on PCIe 3.0 x16, 15.75 GB/s; g6.48xlarge: 8 L4 on PCIe
# 4.0 x16, 31.5 GB/s). Links between hosts are case 5's region pairs and, inside a region, the
# paper's 5 ms / 2 Gbit/s (§4.1).
MIXED_FLEET = (
    ("Oregon", "A100", 2, 8, 2400.0),
    ("Virginia", "V100", 2, 8, NVLINK_GBPS),
    ("Ohio", "T4", 4, 4, 126.0),
    ("Frankfurt", "L4", 2, 8, 252.0),
)


def mixed(variant: str = "paper") -> Cluster:
    """Mixed fleet (beyond the paper): 16 A100 in Oregon, 16 V100 in Virginia, 16 T4 in Ohio and
    16 L4 in Frankfurt, as cloud instances of 4 or 8 GPUs; case-5 links between regions."""
    region_of, host_of, gpu_of, inside = [], [], [], []
    for region, gpu, hosts, per_host, gbps in MIXED_FLEET:
        for _ in range(hosts):
            inside.append(gbps)
            region_of += [region] * per_host
            host_of += [len(inside) - 1] * per_host
            gpu_of += [gpu] * per_host
    c = cluster_from_regions(
        "mixed-fleet",
        region_of,
        _packaged_table("aws_region_pairs_case5.csv"),
        intra_delay_ms=10.0 if variant == "dtfm_code" else 5.0,
        intra_bandwidth_gbps=2.0,
        host_of=host_of,
    )
    delay, bw = c.delay_ms.copy(), c.bandwidth_gbps.copy()
    h = np.asarray(host_of)
    same = np.equal.outer(h, h)
    delay[same] = 0.0
    bw[same] = np.asarray(inside)[h][:, None].repeat(len(h), axis=1)[same]
    return Cluster(
        name="mixed-fleet",
        region_of=tuple(region_of),
        host_of=tuple(host_of),
        delay_ms=delay,
        bandwidth_gbps=bw,
        host_nic_gbps=None,
        gpu_of=tuple(gpu_of),
        description="16 A100 (Oregon) + 16 V100 (Virginia) + 16 T4 (Ohio) + 16 L4 (Frankfurt)",
        meta=_meta("mixed", variant),
    )


CASES: dict[str, Callable[[str], Cluster]] = {
    "1": case1,
    "2": case2,
    "3": case3,
    "4": case4,
    "5": case5,
    "debug": debug,
    "mixed": mixed,
}
PAPER_CASES = ("1", "2", "3", "4", "5")  # the paper's network settings (§4.1)
ALIASES = {"datacenter": "1", "spot": "2", "campus": "3", "regional": "4", "worldwide": "5"}


def case_names() -> tuple[str, ...]:
    return tuple(CASES)


TOPOLOGY_KEYS = (
    "name",
    "devices",
    "pairs",
    "intra_delay_ms",
    "intra_bandwidth_gbps",
    "intra_host_bandwidth_gbps",
    "intra_host_delay_ms",
)
DEVICE_KEYS = ("region", "gpu", "host")  # a device given as a mapping
# A topology's name and its regions reach log lines, tables, file names and the comment line of
# generated shell scripts (system/emulation/tcscript.py): letters (any script), digits, and
# ``_ . - ( )`` and inner spaces only, so no newline, quote, ``;``, ``$`` or backtick gets through.
NAME_PATTERN = re.compile(r"[^\W_][\w.()-]*(?: [\w.()-]+)*")
MAX_NAME_CHARS = 64
_DIGESTS: dict[str, str] = {}  # resolved topology path -> digest of the bytes last loaded
# The topology files last loaded, by (path as given, digest of their bytes, device limit): a
# run's config check and its run load the same file, and a 4,096-device fleet's link matrices
# take seconds to build. A Cluster is frozen and its matrices read-only, so a caller cannot
# change what another is given; a file whose bytes changed is a new key, loaded and checked anew.
_LOADED: dict[tuple[str, str, int | None], Cluster] = {}
MAX_LOADED = 2  # clusters kept (the largest hold n² link matrices)


def check_name(value, what: str) -> str:
    """``value`` when it is a plain name (:data:`NAME_PATTERN`, at most 64 characters), else a
    one-line ValueError naming ``what``."""
    if not isinstance(value, str) or not (
        len(value) <= MAX_NAME_CHARS and NAME_PATTERN.fullmatch(value)
    ):
        raise ValueError(
            f"{what}={value!r} is not a plain name (letters, digits, '_.-()' and inner spaces, "
            f"at most {MAX_NAME_CHARS} characters)"
        )
    return value


def is_topology_file(case) -> bool:
    """Whether ``case`` names a topology file (by its suffix) rather than a built-in case."""
    return str(case).lower().endswith(TOPOLOGY_SUFFIXES)


def _digest(raw: bytes) -> str:  # the key of an input file (system.schema.file_digest)
    return hashlib.sha256(raw).hexdigest()[:16]


def case_digest(case) -> str | None:
    """16-hex SHA-256 of the topology file ``case`` names: of the bytes this process last
    loaded from it (what its results were computed from), else of the file as it is now;
    None for a built-in case (their data is part of :func:`system.schema.model_version`) or
    a file that does not exist."""
    if not is_topology_file(case):
        return None
    p = Path(str(case))
    known = _DIGESTS.get(str(p.resolve()))
    if known is not None:
        return known
    try:
        return _digest(p.read_bytes()) if p.is_file() else None
    except (OSError, ValueError):  # unreadable, or a name with a NUL byte
        return None


def case_label(case) -> str:
    """A case as a file-name part: its name (``5``, ``debug``), or for a topology file its stem
    and content digest (``edit-3fa4b2c1e0d9a7b5``), never a path: results of a file case stay
    inside their folder whatever the path looks like (``/abs/x.yaml``, ``../../x.json``)."""
    if not is_topology_file(case):
        label = canonical_case(case)
    else:
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(str(case)).stem).strip("._") or "topology"
        label = f"{stem[:40]}-{case_digest(case) or 'missing'}"
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", label):
        raise ValueError(f"case {case!r} cannot name a file")
    return label


def _device_entries(devices: list, p: Path) -> tuple[list[str], list[str] | None, list[int]]:
    """Region, GPU type and host index per device entry of topology file ``p`` (the forms of
    :func:`load_topology`); a bad entry is a ValueError naming the file and the entry."""
    from system.gpus import DEFAULT_GPU, GPU_TYPES

    region_of, gpu_of, host_of = [], [], []
    hosts: dict[str, tuple[int, str]] = {}  # host name -> (index, region)
    typed = False
    for i, entry in enumerate(devices):
        where = f"{p}: devices[{i}] = {entry!r}"[:200]
        if isinstance(entry, str):
            region, gpu, host = entry, None, None
        elif isinstance(entry, dict):
            extra = sorted(map(str, set(entry) - set(DEVICE_KEYS)))
            if extra:
                raise ValueError(
                    f"{where}: unknown key(s) {extra}; known: {', '.join(DEVICE_KEYS)}"
                )
            if "region" not in entry:
                raise ValueError(f"{where}: needs a region")
            region, gpu, host = entry["region"], entry.get("gpu"), entry.get("host")
            typed = True
        else:
            raise ValueError(f"{where}: expected a region name or {{region, gpu, host}}")
        if not isinstance(region, str):
            raise ValueError(f"{where}: region must be a name")
        try:
            check_name(region, "region")
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        if gpu is not None and (not isinstance(gpu, str) or gpu not in GPU_TYPES):
            raise ValueError(f"{where}: unknown GPU type {gpu!r}; known: {', '.join(GPU_TYPES)}")
        if host is None:
            key = f"\0{i}"  # a machine of its own
        elif isinstance(host, bool) or not isinstance(host, (str, int)):
            raise ValueError(f"{where}: host must be a name or a number")
        else:
            key = str(host)
            try:
                check_name(key, "host")
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
        if key in hosts and hosts[key][1] != region:
            raise ValueError(
                f"{where}: host {host!r} is already in region {hosts[key][1]!r}; a machine "
                "is in one region"
            )
        hosts.setdefault(key, (len(hosts), region))
        region_of.append(region)
        gpu_of.append(gpu or DEFAULT_GPU)
        host_of.append(hosts[key][0])
    return region_of, (gpu_of if typed else None), host_of


def load_topology(path: str | Path, *, max_devices: int | None = None) -> Cluster:
    """A user topology file (YAML or JSON), usable wherever a case name is::

        name: three-sites                 # optional (default: the file name)
        devices: [Oregon, Oregon, Tokyo]  # region of each device, in device order
        pairs:                            # one row per region pair (and {r, r} inside r)
          - {region_a: Oregon, region_b: Tokyo, delay_ms: 48.5, bandwidth_gbps: 0.6}
        intra_delay_ms: 0.1               # optional: links inside a region without a row
        intra_bandwidth_gbps: 10

    A device is a region name (a V100 alone on its machine, the paper's testbed) or a mapping
    ``{region: R, gpu: T, host: H}``: ``T`` a :data:`system.gpus.GPU_TYPES` name (default V100),
    devices with the same ``H`` (a plain name or a number) on one machine (default: a machine of
    its own), all of one region. Between two GPUs of one machine the links take the optional
    top-level ``intra_host_bandwidth_gbps`` and ``intra_host_delay_ms`` (default 0 ms); without
    them they take the region's link. A bad device entry is one line naming the file and the entry.

        Bad input is one ValueError line naming the file: malformed YAML/JSON, aliases, custom tags
        (:func:`parse_document`), unknown keys, a name or region that is not a plain name
        (:func:`check_name`); more than ``max_devices`` devices is a
        :class:`system.limits.LimitError` (a ValueError; None: the default limit), raised before
        any link matrix is built.

    The last :data:`MAX_LOADED` files loaded are kept by their path, the digest of their bytes
    and ``max_devices``: loading one again returns the same (frozen, read-only) cluster without
    parsing it, and a file whose bytes changed is loaded and checked anew.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"topology file {p} does not exist")
    raw = p.read_bytes()
    digest = _digest(raw)
    key = (str(p), digest, max_devices)
    if key in _LOADED:
        _DIGESTS[str(p.resolve())] = digest
        return _LOADED[key]
    data = parse_document(raw, f"topology file {p}", json_only=_is_json(p))
    if not isinstance(data, dict):
        raise ValueError(f"{p}: expected a mapping with keys {', '.join(TOPOLOGY_KEYS)}")
    extra = sorted(map(str, set(data) - set(TOPOLOGY_KEYS)))
    if extra:
        raise ValueError(f"{p}: unknown key(s) {extra}; known: {', '.join(TOPOLOGY_KEYS)}")
    devices = data.get("devices")
    if not isinstance(devices, list) or not devices:
        raise ValueError(f"{p}: devices must be a non-empty list of region names or mappings")
    check_devices(len(devices), what=f"topology file {p}", limit=max_devices)
    name = data.get("name")
    name = p.stem if name is None else check_name(name, f"{p}: name")
    region_of, gpu_of, host_of = _device_entries(devices, p)
    intra = {}
    for k in ("intra_delay_ms", "intra_bandwidth_gbps"):
        if data.get(k) is not None:
            intra[k] = _number(data[k], k, str(p), 0)
    host_link = {}
    for k in ("intra_host_bandwidth_gbps", "intra_host_delay_ms"):
        if data.get(k) is not None:
            host_link[k] = _number(data[k], k, str(p), 0)
    if (
        host_link.get("intra_host_bandwidth_gbps", 1.0) <= 0
        or host_link.get("intra_host_delay_ms", 0.0) < 0
    ):
        raise ValueError(f"{p}: need intra_host_bandwidth_gbps > 0 and intra_host_delay_ms >= 0")
    if "intra_host_delay_ms" in host_link and "intra_host_bandwidth_gbps" not in host_link:
        raise ValueError(f"{p}: intra_host_delay_ms needs intra_host_bandwidth_gbps too")
    cluster = cluster_from_regions(
        name,
        region_of,
        _pairs_from_rows(data.get("pairs"), str(p)),
        host_of=host_of,
        gpu_of=gpu_of,
        meta={"source": str(p), "source_sha256": digest},
        **intra,
        **host_link,
    )
    _DIGESTS[str(p.resolve())] = digest
    # a file names no link-sharing model: the one default, as get_case and the harness use
    cluster = replace(cluster, link_sharing=LinkSharing())
    while len(_LOADED) >= MAX_LOADED:
        del _LOADED[next(iter(_LOADED))]  # the oldest
    _LOADED[key] = cluster
    return cluster


def canonical_case(name: str | int) -> str:
    """The one name of a case: an alias becomes its number (``worldwide`` -> ``"5"``), an
    integer its text; a topology file's path and unknown names are returned as given.

    >>> canonical_case("worldwide"), canonical_case(5), canonical_case("debug")
    ('5', '5', 'debug')
    """
    text = str(name)
    return text if is_topology_file(text) else ALIASES.get(text, text)


def get_case(name: str | int, variant: str = "paper", *, max_devices: int | None = None) -> Cluster:
    """The cluster of a named case (``1``..``5``, ``debug``, an alias like ``worldwide``) or of
    a topology file (``.yaml``/``.yml``/``.json``, :func:`load_topology` with ``max_devices``),
    under the default link-sharing model (:data:`system.cluster.DEFAULT_LINK_SHARING`) unless the
    cluster says another."""
    if is_topology_file(name):
        cluster = load_topology(name, max_devices=max_devices)
    else:
        key = canonical_case(name)
        if key not in CASES:
            raise ValueError(
                f"unknown case {name!r}; known: {', '.join(CASES)} (or {', '.join(ALIASES)})"
            )
        if variant not in VARIANTS:
            raise ValueError(f"unknown case variant {variant!r}; known: {', '.join(VARIANTS)}")
        cluster = CASES[key](variant)
    if cluster.link_sharing is None:  # the one default, as the harness's
        cluster = replace(cluster, link_sharing=LinkSharing())
    return cluster
