"""Communication-reducing training options and the bytes they put on the wire (pure Python).

:class:`Compression` holds three families, each off by default (``method="none"``), each usable
with any scheduled layout; it is ``RunSpec.compression``, and :meth:`Compression.to_dict` /
:meth:`Compression.from_dict` are its nested JSON form (``{"pipe": {...}, "dp": {...}}``).

* :class:`PipeCompression`: the activations a stage sends forward and the gradients it sends
  back quantized (``quantize``), or the forward message the quantized change of each sample's
  activation against a buffer sender and receiver keep in step (``aq_sgd``, Wang et al.,
  NeurIPS 2022; a sample's first crossing goes in full precision);
* :class:`DPCompression`: each gradient shard sparsified — its ``ratio`` largest magnitudes
  (``topk``, int32 indices) or a random subset from a seed every replica shares (``random``, no
  indices) — the kept values quantized to ``bits`` (32: fp32), with error feedback (Seide et
  al. 2014; Karimireddy et al., ICML 2019; CocktailSGD, Wang et al., ICML 2023);
* :class:`LocalSGD`: DiLoCo (Douillard et al., 2023): ``inner_steps`` optimizer steps per
  replica alone, then an outer Nesterov SGD step on the averaged pseudo-gradient, its exchange
  fp32 or int8 (INTELLECT-1, Jaghouar et al., 2024).

Quantization is symmetric per group of :data:`GROUP_SIZE` elements: one fp32 scale (the group's
largest magnitude / (2^(bits−1) − 1)) and one signed integer per element, two 4-bit values per
byte. This module states the options and counts their bytes; the runtime's codecs
(:mod:`system.runtime.codec`) pack real tensors, the simulator
(:mod:`system.simulator.compressed_traffic`) uses these counts, and a test compares the two.

    >>> quantized_nbytes(1000, 8)  # 8 groups of 128: 1024 one-byte values + 8 fp32 scales
    1056
    >>> sparse_nbytes(1000, ratio=0.01, bits=8, indices=True)  # 10 int32 indices, 10 values
    172
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields

__all__ = [
    "GROUP_SIZE",
    "SCALE_BYTES",
    "INDEX_BYTES",
    "PIPE_METHODS",
    "DP_METHODS",
    "LOCAL_SGD_METHODS",
    "QUANT_BITS",
    "VALUE_BITS",
    "OUTER_BITS",
    "PipeCompression",
    "DPCompression",
    "LocalSGD",
    "Compression",
    "quantized_nbytes",
    "kept_count",
    "sparse_nbytes",
]

GROUP_SIZE = 128  # elements per quantization scale (even: two 4-bit values per byte)
SCALE_BYTES = 4  # one fp32 scale per group
INDEX_BYTES = 4  # int32 index per kept element (top-k)

PIPE_METHODS = ("none", "quantize", "aq_sgd")
DP_METHODS = ("none", "topk", "random")
LOCAL_SGD_METHODS = ("none", "diloco")
QUANT_BITS = (4, 8)  # integer formats of the quantizer
VALUE_BITS = (4, 8, 32)  # sparsified values: quantized, or fp32 (32)
OUTER_BITS = (8, 32)  # DiLoCo's outer exchange: int8 or fp32


def quantized_nbytes(numel: int, bits: int) -> int:
    """Bytes of ``numel`` values quantized to ``bits`` (groups padded to :data:`GROUP_SIZE`)."""
    if bits not in QUANT_BITS:
        raise ValueError(f"quantized_nbytes: bits={bits} is not one of {QUANT_BITS}")
    groups = -(-int(numel) // GROUP_SIZE)
    return groups * GROUP_SIZE * bits // 8 + groups * SCALE_BYTES


def kept_count(numel: int, ratio: float) -> int:
    """Elements a sparsifier keeps of ``numel``: ⌈ratio·numel⌉, at least 1."""
    return max(1, math.ceil(ratio * int(numel)))


def sparse_nbytes(numel: int, *, ratio: float, bits: int, indices: bool) -> int:
    """Bytes of a sparsified message: kept values (quantized, or fp32 for ``bits`` = 32), plus
    an int32 index per kept value when ``indices`` (top-k; a shared-seed random choice sends
    none)."""
    k = kept_count(numel, ratio)
    values = 4 * k if bits == 32 else quantized_nbytes(k, bits)
    return values + (INDEX_BYTES * k if indices else 0)


def _one_of(where: str, name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{where}: {name}={value!r} is not one of {allowed}")


@dataclass(frozen=True, slots=True, kw_only=True)
class PipeCompression:
    """Compression of the messages between pipeline stages (off: ``method="none"``)."""

    method: str = "none"  # none | quantize | aq_sgd
    fwd_bits: int = 8  # activations (aq_sgd: their per-sample changes)
    bwd_bits: int = 8  # activation gradients

    def check(self, where: str) -> None:
        _one_of(where, "pipe.method", self.method, PIPE_METHODS)
        if self.active:
            _one_of(where, "pipe.fwd_bits", self.fwd_bits, QUANT_BITS)
            _one_of(where, "pipe.bwd_bits", self.bwd_bits, QUANT_BITS)

    @property
    def active(self) -> bool:
        return self.method != "none"

    def forward_nbytes(self, numel: int, element_bytes: int, *, first_visit: bool) -> int:
        """Bytes of one forward message of ``numel`` activations (``element_bytes`` each when
        sent uncompressed); ``first_visit``: aq_sgd's samples not seen at this boundary yet."""
        if self.method == "none" or (self.method == "aq_sgd" and first_visit):
            return int(numel) * element_bytes
        return quantized_nbytes(numel, self.fwd_bits)

    def backward_nbytes(self, numel: int, element_bytes: int) -> int:
        """Bytes of one backward message of ``numel`` activation gradients."""
        if not self.active:
            return int(numel) * element_bytes
        return quantized_nbytes(numel, self.bwd_bits)


@dataclass(frozen=True, slots=True, kw_only=True)
class DPCompression:
    """Compression of the per-step data-parallel gradient exchange (off: ``method="none"``)."""

    method: str = "none"  # none | topk | random
    ratio: float = 0.05  # fraction of each shard's elements kept, in (0, 1]
    bits: int = 8  # kept values: 4 or 8 (quantized) or 32 (fp32)
    error_feedback: bool = True

    def check(self, where: str) -> None:
        _one_of(where, "dp.method", self.method, DP_METHODS)
        if self.active:
            if not (isinstance(self.ratio, (int, float)) and 0 < self.ratio <= 1):
                raise ValueError(f"{where}: dp.ratio={self.ratio!r} must be in (0, 1]")
            _one_of(where, "dp.bits", self.bits, VALUE_BITS)

    @property
    def active(self) -> bool:
        return self.method != "none"

    def message_nbytes(self, numel: int) -> int:
        """Bytes of one compressed message of ``numel`` gradient elements."""
        return sparse_nbytes(numel, ratio=self.ratio, bits=self.bits, indices=self.method == "topk")


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalSGD:
    """DiLoCo's outer loop (off: ``method="none"``). Defaults: the DiLoCo paper's outer SGD,
    learning rate 0.7, Nesterov momentum 0.9."""

    method: str = "none"  # none | diloco
    inner_steps: int = 8  # H: inner optimizer steps per outer step
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    nesterov: bool = True
    outer_bits: int = 32  # outer exchange: 32 (fp32) or 8 (int8)

    def check(self, where: str) -> None:
        _one_of(where, "local.method", self.method, LOCAL_SGD_METHODS)
        if self.active:
            if not (isinstance(self.inner_steps, int) and self.inner_steps >= 1):
                raise ValueError(f"{where}: local.inner_steps={self.inner_steps!r} must be >= 1")
            if not self.outer_lr > 0:
                raise ValueError(f"{where}: local.outer_lr must be > 0, got {self.outer_lr}")
            if not 0 <= self.outer_momentum < 1:
                raise ValueError(
                    f"{where}: local.outer_momentum must be in [0, 1), got {self.outer_momentum}"
                )
            if self.nesterov and self.outer_momentum == 0:
                raise ValueError(f"{where}: local.nesterov needs local.outer_momentum > 0")
            _one_of(where, "local.outer_bits", self.outer_bits, OUTER_BITS)

    @property
    def active(self) -> bool:
        return self.method != "none"

    def message_nbytes(self, numel: int) -> int:
        """Bytes of one outer-exchange message of ``numel`` parameter-change elements."""
        return 4 * int(numel) if self.outer_bits == 32 else quantized_nbytes(numel, self.outer_bits)


@dataclass(frozen=True, slots=True, kw_only=True)
class Compression:
    """All three families for one run; :meth:`check` refuses bad values and bad combinations."""

    pipe: PipeCompression = field(default_factory=PipeCompression)
    dp: DPCompression = field(default_factory=DPCompression)
    local: LocalSGD = field(default_factory=LocalSGD)

    def check(self, where: str, *, dp_mode: str = "sharded_ps") -> None:
        self.pipe.check(where)
        self.dp.check(where)
        self.local.check(where)
        if self.dp.active and dp_mode not in ("sharded_ps", "ring"):
            raise ValueError(
                f"{where}: dp.method={self.dp.method!r} runs inside dp_mode 'sharded_ps' or "
                f"'ring', not {dp_mode!r}"
            )
        if dp_mode == "ring" and not self.dp.active:
            raise ValueError(f"{where}: dp_mode 'ring' is the compressed ring; set dp.method")
        if self.local.active and self.dp.active:
            raise ValueError(
                f"{where}: local.method='diloco' has no per-step gradient exchange to compress; "
                "use local.outer_bits=8 for its outer exchange instead of dp.method"
            )

    @property
    def active(self) -> bool:
        return self.pipe.active or self.dp.active or self.local.active

    def label(self) -> str:
        """Short text, e.g. ``pipe-quantize4/8 dp-topk0.05x8ef``; ``none`` when all are off."""
        parts = []
        if self.pipe.active:
            parts.append(f"pipe-{self.pipe.method}{self.pipe.fwd_bits}/{self.pipe.bwd_bits}")
        if self.dp.active:
            ef = "ef" if self.dp.error_feedback else ""
            parts.append(f"dp-{self.dp.method}{self.dp.ratio:g}x{self.dp.bits}{ef}")
        if self.local.active:
            parts.append(f"diloco-H{self.local.inner_steps}-outer{self.local.outer_bits}")
        return " ".join(parts) or "none"

    def to_dict(self, *, only_active: bool = False) -> dict:
        """The nested form ``{"pipe": {...}, "dp": {...}, "local": {...}}`` (JSON-ready), what
        :meth:`from_dict` reads back; ``only_active``: the families that are on, alone."""
        out = asdict(self)
        if only_active:
            out = {k: v for k, v in out.items() if getattr(self, k).active}
        return out

    @classmethod
    def from_dict(cls, data: Mapping, where: str = "Compression") -> Compression:
        """The options of :meth:`to_dict`'s nested form; a family or field left out keeps its
        default. An unknown family or field is one ValueError naming it."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: expected a mapping of pipe/dp/local, got {data!r}")
        families = {f.name: f.default_factory for f in fields(cls)}
        unknown = sorted(set(data) - set(families))
        if unknown:
            raise ValueError(f"{where}: unknown part(s) {unknown}; known: {sorted(families)}")
        parts = {}
        for name, value in data.items():
            family = families[name]
            if isinstance(value, family):
                parts[name] = value
                continue
            if not isinstance(value, Mapping):
                raise ValueError(f"{where}: {name} must be a mapping, got {value!r}")
            known = {f.name for f in fields(family)}
            extra = sorted(set(value) - known)
            if extra:
                raise ValueError(
                    f"{where}: unknown field(s) {[f'{name}.{k}' for k in extra]}; "
                    f"known: {sorted(known)}"
                )
            parts[name] = family(**value)
        return cls(**parts)
