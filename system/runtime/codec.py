"""Codecs: flat fp32 tensors to the bytes a rank sends, and back (quantization, sparsification).

Every codec turns a 1-D fp32 tensor of ``numel`` elements into one ``uint8`` payload whose size
depends only on ``numel`` (so the receiver posts a buffer of the right size before the data
exists) and decodes it again:

* :class:`Quantizer` (``bits`` 4 or 8): symmetric, one fp32 scale per group of
  :data:`system.compression.GROUP_SIZE` elements, ``scale = max|x| / (2^(bits−1) − 1)``,
  ``q = round(x / scale)``; every decoded element is within ``scale / 2`` of the input. Layout:
  ``[scales (fp32) | values]``, 4-bit values two per byte (low nibble first), stored as
  ``q + 8``;
* :class:`Sparsifier` (``topk`` or ``random``): keeps k = ⌈ratio·numel⌉ elements — the largest
  magnitudes, or a random subset drawn from ``key`` (sender and receiver pass the same key, so
  no indices travel) — and quantizes the kept values (or sends them as fp32, ``bits`` = 32).
  Layout: ``[indices (int32, top-k only) | kept values]``, kept indices in increasing order;
* :class:`Raw`: the fp32 bytes themselves (DiLoCo's fp32 outer exchange).

Payload sections start at multiples of 4 bytes, so each is viewed in place as its own dtype.
The byte counts are computed here from the tensors built; :mod:`system.compression` states the
same counts as formulas for the simulator, and a test compares them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from system.compression import GROUP_SIZE, QUANT_BITS, VALUE_BITS, kept_count

__all__ = ["Codec", "Raw", "Quantizer", "Sparsifier", "mix_key"]


def mix_key(*parts: int) -> int:
    """One 63-bit seed from integers (seed, step, bucket, shard, ...), the same on every rank."""
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (int(p) & 0xFFFFFFFFFFFF)) * 1099511628211) % (1 << 63)
    return h


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8).reshape(-1)


class Codec:
    """Interface: ``encode(x, key) -> uint8 payload``, ``decode(payload, numel, key) -> fp32``,
    ``nbytes(numel)`` (the payload size, fixed by ``numel``)."""

    def nbytes(self, numel: int) -> int:
        raise NotImplementedError

    def encode(self, x: torch.Tensor, key: int = 0) -> torch.Tensor:
        raise NotImplementedError

    def decode(self, payload: torch.Tensor, numel: int, key: int = 0) -> torch.Tensor:
        raise NotImplementedError

    def roundtrip(self, x: torch.Tensor, key: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(payload, what the receiver decodes from it): error feedback needs both."""
        payload = self.encode(x, key)
        return payload, self.decode(payload, x.numel(), key)


class Raw(Codec):
    """fp32 as it is."""

    def nbytes(self, numel: int) -> int:
        return 4 * int(numel)

    def encode(self, x: torch.Tensor, key: int = 0) -> torch.Tensor:
        return _bytes(x.detach().float().reshape(-1).clone())

    def decode(self, payload: torch.Tensor, numel: int, key: int = 0) -> torch.Tensor:
        return payload.view(torch.float32)[:numel].clone()


class Quantizer(Codec):
    """Symmetric per-group integer quantization to 4 or 8 bits (module docstring)."""

    def __init__(self, bits: int) -> None:
        if bits not in QUANT_BITS:
            raise ValueError(f"Quantizer: bits={bits} is not one of {QUANT_BITS}")
        self.bits = bits
        self.qmax = 2 ** (bits - 1) - 1

    def _groups(self, numel: int) -> int:
        return -(-int(numel) // GROUP_SIZE)

    def nbytes(self, numel: int) -> int:
        g = self._groups(numel)
        return 4 * g + g * GROUP_SIZE * self.bits // 8

    def quantize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(int8 codes of shape (groups, GROUP_SIZE), fp32 scales (groups,)) of flat ``x``."""
        x = x.detach().float().reshape(-1)
        g = self._groups(x.numel())
        xg = F.pad(x, (0, g * GROUP_SIZE - x.numel())).view(g, GROUP_SIZE)
        scale = xg.abs().amax(dim=1) / self.qmax
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = torch.round(xg / safe[:, None]).clamp_(-self.qmax, self.qmax).to(torch.int8)
        return q, scale

    def encode(self, x: torch.Tensor, key: int = 0) -> torch.Tensor:
        q, scale = self.quantize(x)
        if self.bits == 8:
            values = q.view(torch.uint8).reshape(-1)
        else:  # two codes per byte: q + 8 in 1..15, low nibble first
            u = (q.reshape(-1).to(torch.int16) + 8).to(torch.uint8)
            values = u[0::2] | (u[1::2] << 4)
        return torch.cat([_bytes(scale), values])

    def decode(self, payload: torch.Tensor, numel: int, key: int = 0) -> torch.Tensor:
        g = self._groups(numel)
        scale = payload[: 4 * g].view(torch.float32)
        values = payload[4 * g :]
        if self.bits == 8:
            q = values.view(torch.int8).to(torch.float32)
        else:
            lo = (values & 0x0F).to(torch.float32) - 8
            hi = (values >> 4).to(torch.float32) - 8
            q = torch.stack([lo, hi], dim=1).reshape(-1)
        return (q.view(g, GROUP_SIZE) * scale[:, None]).reshape(-1)[:numel]


class Sparsifier(Codec):
    """Top-k or shared-seed random sparsification, kept values quantized (module docstring)."""

    def __init__(self, method: str, ratio: float, bits: int) -> None:
        if method not in ("topk", "random"):
            raise ValueError(f"Sparsifier: method {method!r} is not 'topk' or 'random'")
        if not 0 < ratio <= 1:
            raise ValueError(f"Sparsifier: ratio={ratio} must be in (0, 1]")
        if bits not in VALUE_BITS:
            raise ValueError(f"Sparsifier: bits={bits} is not one of {VALUE_BITS}")
        self.method, self.ratio, self.bits = method, float(ratio), bits
        self.values: Codec = Raw() if bits == 32 else Quantizer(bits)

    def _index_bytes(self, numel: int) -> int:
        return 4 * kept_count(numel, self.ratio) if self.method == "topk" else 0

    def nbytes(self, numel: int) -> int:
        return self._index_bytes(numel) + self.values.nbytes(kept_count(numel, self.ratio))

    def _random_indices(self, numel: int, key: int) -> torch.Tensor:
        g = torch.Generator(device="cpu")
        g.manual_seed(key)
        k = kept_count(numel, self.ratio)
        return torch.randperm(numel, generator=g)[:k].sort().values

    def encode(self, x: torch.Tensor, key: int = 0) -> torch.Tensor:
        x = x.detach().float().reshape(-1)
        k = kept_count(x.numel(), self.ratio)
        if self.method == "topk":
            idx = torch.topk(x.abs(), k, sorted=False).indices.sort().values
            head = _bytes(idx.to(torch.int32))
        else:
            idx = self._random_indices(x.numel(), key).to(x.device)
            head = x.new_empty(0, dtype=torch.uint8)
        return torch.cat([head, self.values.encode(x[idx])])

    def decode(self, payload: torch.Tensor, numel: int, key: int = 0) -> torch.Tensor:
        k = kept_count(numel, self.ratio)
        split = self._index_bytes(numel)
        if self.method == "topk":
            idx = payload[:split].view(torch.int32).to(torch.int64)
        else:
            idx = self._random_indices(numel, key).to(payload.device)
        out = torch.zeros(numel, dtype=torch.float32, device=payload.device)
        out[idx] = self.values.decode(payload[split:], k)
        return out
