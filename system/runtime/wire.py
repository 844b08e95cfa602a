"""What crosses a pipeline boundary: activations forward, their gradients backward (paper §3.5).

A :class:`Wire` is one direction of one boundary as one rank sees it. The schedule
(:mod:`system.runtime.pipeline`) asks it for the buffer to post (:meth:`Wire.recv_buffer`), turns
a tensor into the message to send (:meth:`Wire.encode`) and a received message back into a
tensor (:meth:`Wire.decode`). Each call names the micro-batch's samples (dataset indices), which
only :class:`AQSGDWire` uses.

* :class:`PlainWire` — the tensor itself in the wire dtype (fp32, or fp16 with amp); the default;
* :class:`QuantizedWire` — :class:`system.runtime.codec.Quantizer` at 8 or 4 bits;
* :class:`AQSGDWire` — activation compression with per-sample buffers (AQ-SGD, Wang et al.,
  NeurIPS 2022): sender and receiver each keep, per sample, the activation as the receiver has
  it (m). The first time a sample crosses the boundary the activation goes in full precision and
  m is set to it; afterwards the sender sends Q(a − m) and both sides add the decoded change to
  m, which the receiver uses as the activation. Both sides decide "first time" from the sample
  indices alone, so the receiver posts the right buffer size ahead. With data parallelism each
  replica's boundary keeps its own buffers, so a sample is new to it until it has passed that
  replica once.

    >>> import torch
    >>> send, recv = AQSGDWire(bits=4), AQSGDWire(bits=4)
    >>> a = torch.randn(2, 4, 64)
    >>> msg = send.encode(a, [5, 9]); bool(torch.equal(recv.decode(msg, a.shape, [5, 9]), a))
    True
    >>> b = a + 0.01 * torch.randn(2, 4, 64)      # the same samples, an epoch later
    >>> msg = send.encode(b, [5, 9]); msg.numel(), 4 * b.numel()  # bytes: 4-bit change vs fp32
    (272, 2048)
    >>> float((recv.decode(msg, b.shape, [5, 9]) - b).abs().max()) < 0.01
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from system.compression import PipeCompression
from system.runtime.codec import Quantizer

__all__ = ["Wire", "PlainWire", "QuantizedWire", "AQSGDWire", "StageWires", "make_wires"]


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


class Wire:
    """One direction of one pipeline boundary (see the module docstring)."""

    def recv_buffer(
        self, shape: Sequence[int], samples: Sequence[int], device: torch.device
    ) -> torch.Tensor:
        raise NotImplementedError  # pragma: no cover - interface

    def encode(self, x: torch.Tensor, samples: Sequence[int]) -> torch.Tensor:
        raise NotImplementedError  # pragma: no cover

    def decode(
        self, msg: torch.Tensor, shape: Sequence[int], samples: Sequence[int]
    ) -> torch.Tensor:
        raise NotImplementedError  # pragma: no cover


class PlainWire(Wire):
    """The tensor in ``dtype`` (fp32 on CPU, fp16 with amp): no compression."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        self.dtype = dtype

    def recv_buffer(self, shape, samples, device):
        return torch.empty(tuple(shape), dtype=self.dtype, device=device)

    def encode(self, x, samples):
        return x.detach().to(self.dtype)

    def decode(self, msg, shape, samples):
        return msg.float()


class QuantizedWire(Wire):
    """Per-group integer quantization (:class:`system.runtime.codec.Quantizer`)."""

    def __init__(self, bits: int) -> None:
        self.codec = Quantizer(bits)

    def recv_buffer(self, shape, samples, device):
        return torch.empty(self.codec.nbytes(_numel(shape)), dtype=torch.uint8, device=device)

    def encode(self, x, samples):
        return self.codec.encode(x.reshape(-1))

    def decode(self, msg, shape, samples):
        return self.codec.decode(msg, _numel(shape)).view(tuple(shape))


class AQSGDWire(Wire):
    """Quantized changes against per-sample buffers (module docstring). ``shape[0]`` of every
    tensor is the micro-batch, one row per sample of ``samples``. A message is the new rows in
    fp32 followed by the quantized changes of the known rows (either part may be empty)."""

    def __init__(self, bits: int) -> None:
        self.codec = Quantizer(bits)
        self.memory: dict[int, torch.Tensor] = {}  # sample -> activation as the receiver has it

    def _split(self, samples: Sequence[int]) -> tuple[list[int], list[int]]:
        """Row positions of samples new to this boundary, and of known ones."""
        new = [r for r, s in enumerate(samples) if int(s) not in self.memory]
        return new, [r for r in range(len(samples)) if r not in set(new)]

    def _sizes(self, shape: Sequence[int], samples: Sequence[int]) -> tuple[int, int]:
        """(bytes of the fp32 new rows, bytes of the quantized changes)."""
        new, known = self._split(samples)
        row = _numel(shape[1:])
        return 4 * row * len(new), self.codec.nbytes(row * len(known)) if known else 0

    def recv_buffer(self, shape, samples, device):
        return torch.empty(sum(self._sizes(shape, samples)), dtype=torch.uint8, device=device)

    def _remember(self, rows: torch.Tensor, samples: Sequence[int]) -> None:
        for row, s in zip(rows, samples, strict=True):
            self.memory[int(s)] = row.detach().clone()

    def _buffered(self, samples: Sequence[int]) -> torch.Tensor:
        return torch.stack([self.memory[int(s)] for s in samples])

    def encode(self, x, samples):
        x = x.detach().float()
        new, known = self._split(samples)
        parts = []
        if new:
            parts.append(x[new].contiguous().view(torch.uint8).reshape(-1))
        if known:
            ids = [samples[r] for r in known]
            m = self._buffered(ids)
            payload, change = self.codec.roundtrip((x[known] - m).reshape(-1))
            parts.append(payload)
            self._remember(m + change.view(m.shape), ids)
        if new:
            self._remember(x[new], [samples[r] for r in new])
        return torch.cat(parts)

    def decode(self, msg, shape, samples):
        new, known = self._split(samples)
        full_bytes, _ = self._sizes(shape, samples)
        out = torch.empty(tuple(shape), dtype=torch.float32, device=msg.device)
        if known:
            ids = [samples[r] for r in known]
            m = self._buffered(ids)
            change = self.codec.decode(msg[full_bytes:], m.numel()).view(m.shape)
            out[known] = m + change
            self._remember(out[known], ids)
        if new:
            out[new] = msg[:full_bytes].view(torch.float32).view(len(new), *shape[1:])
            self._remember(out[new], [samples[r] for r in new])
        return out


@dataclass(frozen=True, slots=True)
class StageWires:
    """The wires of one stage: from the previous stage (activations in, gradients out) and to
    the next (activations out, gradients in). Each boundary side has its own objects, since
    AQ-SGD's buffers belong to one boundary."""

    fwd_in: Wire
    bwd_out: Wire
    fwd_out: Wire
    bwd_in: Wire


def _pair(options: PipeCompression, dtype: torch.dtype) -> tuple[Wire, Wire]:
    if options.method == "none":
        return PlainWire(dtype), PlainWire(dtype)
    if options.method == "quantize":
        return QuantizedWire(options.fwd_bits), QuantizedWire(options.bwd_bits)
    if options.method == "aq_sgd":
        return AQSGDWire(options.fwd_bits), QuantizedWire(options.bwd_bits)
    raise ValueError(f"make_wires: unknown pipe compression {options.method!r}")


def make_wires(options: PipeCompression, dtype: torch.dtype = torch.float32) -> StageWires:
    """A stage's wires for ``options`` (``dtype``: the uncompressed wire dtype)."""
    fwd_in, bwd_out = _pair(options, dtype)
    fwd_out, bwd_in = _pair(options, dtype)
    return StageWires(fwd_in=fwd_in, bwd_out=bwd_out, fwd_out=fwd_out, bwd_in=bwd_in)
