"""Validation settings: one emulated network + model shape + parallel layout per entry.

A settings file is JSON: ``{"settings": [{...}, ...], "rules": {...}}``; every entry names the
fields of :class:`Setting` (defaults below); ``rules`` (optional, :func:`load_rules`) fixes
scoring rules before the runs. Loading checks every field and names the entry and field
that is wrong.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from baselines.placement import Placement
from system.workload import GPTConfig, Workload, get_model

__all__ = [
    "Setting",
    "SYSTEMS",
    "DEFAULT_SYSTEMS",
    "baseline_placement",
    "load_rules",
    "load_settings",
    "read_document",
]

# Systems a setting can run: our runtime on the scheduled layout and on a random layout, and the
# baselines at launch placement (rank i on emulated device i) or at the topology-aware placement
# the baselines' grid search uses (``<framework>_topology``: :func:`baselines.placement.
# search_placement`, ranked by the same simulator that makes the prediction). A setting that
# names no systems runs the first four (the systems of the rounds registered before the
# topology placement was supported).
SYSTEMS = (
    "ours",
    "ours_random",
    "megatron",
    "deepspeed",
    "megatron_topology",
    "deepspeed_topology",
)
DEFAULT_SYSTEMS = SYSTEMS[:4]


def baseline_placement(system: str) -> tuple[str, str]:
    """(framework, placement) of a baseline system name: ``megatron`` -> (megatron, launch),
    ``deepspeed_topology`` -> (deepspeed, topology); ValueError for ours or an unknown name."""
    framework, _, placement = system.partition("_")
    if framework not in ("megatron", "deepspeed") or placement not in ("", Placement.topology):
        raise ValueError(f"{system!r} is not a baseline system; baselines: {SYSTEMS[2:]}")
    return framework, placement or Placement.launch


@dataclass(frozen=True, kw_only=True)
class Setting:
    """One validation setting (a subset of a paper case, scaled links, a small GPT)."""

    name: str
    case: str
    devices: tuple[int, ...]
    pp: int
    dp: int
    global_batch_size: int
    micro_batch_size: int = 1
    num_layers: int = 4
    hidden_size: int = 256
    seq_length: int = 64
    vocab_size: int = 128
    bandwidth_scale: float = 0.1
    delay_scale: float = 1.0
    iters: int = 5
    warmup_iters: int = 2
    seed: int = 0
    systems: tuple[str, ...] = DEFAULT_SYSTEMS
    note: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        def bad(what: str) -> ValueError:
            return ValueError(f"validation setting {self.name!r}: {what}")

        if not self.name or not all(c.isalnum() or c in "-_" for c in self.name):
            raise bad("name must be letters, digits, '-' or '_'")
        if self.pp < 1 or self.dp < 1 or self.pp * self.dp != len(self.devices):
            raise bad(f"pp={self.pp} x dp={self.dp} must equal the {len(self.devices)} devices")
        if len(set(self.devices)) != len(self.devices):
            raise bad(f"devices {list(self.devices)} repeat a device")
        if self.num_layers % self.pp:
            raise bad(f"num_layers={self.num_layers} is not divisible by pp={self.pp}")
        if self.hidden_size % self.model.num_attention_heads:
            raise bad(f"hidden_size={self.hidden_size} is not divisible by the heads")
        if not 0 < self.bandwidth_scale <= 1 or not 0 < self.delay_scale <= 1:
            raise bad("bandwidth_scale and delay_scale must be in (0, 1]")
        if self.iters <= self.warmup_iters or self.warmup_iters < 0:
            raise bad(f"iters={self.iters} must exceed warmup_iters={self.warmup_iters} >= 0")
        unknown = sorted(set(self.systems) - set(SYSTEMS))
        if unknown or not self.systems:
            raise bad(f"systems must be a non-empty subset of {SYSTEMS}, got {list(self.systems)}")
        self.workload.check_layout(self.pp, self.dp)  # batch divisible into micro-batches

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def model(self) -> GPTConfig:
        """The ``debug`` GPT (4 heads) with this setting's shape: what every runtime builds."""
        return dataclasses.replace(
            get_model("debug", self.num_layers),
            hidden_size=self.hidden_size,
            seq_length=self.seq_length,
            vocab_size=self.vocab_size,
        )

    @property
    def workload(self) -> Workload:
        """The CPU runtimes send fp32 activations and fp32 gradients."""
        return Workload(
            model=self.model,
            global_batch_size=self.global_batch_size,
            micro_batch_size=self.micro_batch_size,
            activation_bytes=4,
            gradient_bytes=4,
        )

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["devices"], d["systems"] = list(self.devices), list(self.systems)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Setting:
        known = {f.name for f in dataclasses.fields(cls)}
        name = d.get("name", "?")
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"validation setting {name!r}: unknown field(s) {unknown}")
        missing = sorted(
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
            and f.name not in d
        )
        if missing:
            raise ValueError(f"validation setting {name!r}: missing field(s) {missing}")
        d = {**d, "case": str(d["case"]), "devices": tuple(int(x) for x in d["devices"])}
        if "systems" in d:
            d["systems"] = tuple(d["systems"])
        return cls(**d)


def read_document(path: str | Path, what: str, valid, expected: str, hint: str = "") -> dict:
    """The JSON object at ``path``: one error naming ``what`` and the path when the file is
    missing (``hint`` says how to make it), is not JSON, or fails ``valid`` (``expected`` says
    what it should be). The settings, compute-profile and predictions files are read with it."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {path} does not exist{hint}") from None
    except ValueError as e:
        raise ValueError(f"{what} {path}: not JSON ({e})") from None
    if not isinstance(data, dict) or not valid(data):
        raise ValueError(f"{what} {path}: {expected}")
    return data


def load_rules(path: str | Path) -> dict:
    """The settings file's optional ``"rules"`` object: scoring rules fixed with the settings,
    so they are registered (committed in the predictions) before any run they score. Known:
    ``tie_tolerance`` (a fraction in [0, 0.5)): systems whose predictions lie within it of each
    other count as tied in the secondary Kendall τ
    (:func:`~repro.studies.validation.score.tied_ranks`)."""
    data = read_document(
        path,
        "validation settings file",
        lambda d: isinstance(d.get("rules", {}), dict),
        '"rules" must be an object',
    )
    rules = dict(data.get("rules", {}))
    unknown = sorted(set(rules) - {"tie_tolerance"})
    if unknown:
        raise ValueError(f"validation settings file {path}: unknown rule(s) {unknown}")
    tol = rules.get("tie_tolerance")
    if tol is not None and not (isinstance(tol, int | float) and 0 <= tol < 0.5):
        raise ValueError(
            f"validation settings file {path}: tie_tolerance must be a number in [0, 0.5), "
            f"got {tol!r}"
        )
    return rules


def load_settings(path: str | Path) -> list[Setting]:
    """The settings of a JSON file, in file order; names must be unique."""
    data = read_document(
        path,
        "validation settings file",
        lambda d: isinstance(d.get("settings"), list),
        'expected {"settings": [...]}',
    )
    out = [Setting.from_dict(d) for d in data["settings"]]
    names = [s.name for s in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"validation settings file {path}: duplicate name(s) {dup}")
    return out
