"""Point-to-point transport between pipeline stages (paper §3.5), separate from the schedule.

Receives are posted ahead (non-blocking ``irecv``) so the transfer of micro-batch i+1 overlaps the
computation of i; sends are non-blocking (``isend``) so sending i−1 overlaps it too. On CPU
(gloo) the host blocks only in :meth:`P2P.wait`, which the timeline records as ``wait``. On CUDA
(NCCL) receives and sends are issued on their own streams: the compute stream waits on the
receive's completion without blocking the host, and a send waits on an event recorded after the
computation that produced its tensor — the paper's receive / compute / send streams chained by
events.

:attr:`P2P.bytes_sent` counts the payload bytes of every send (what the wire carries, less the
transport's headers), for the compression options' byte accounting.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist

from system.runtime.timeline import Timeline

__all__ = ["P2P", "Pending"]


@dataclass
class Pending:
    """A posted transfer: the tensor it fills or reads, its work handle, a label for the trace."""

    tensor: torch.Tensor
    work: object
    name: str


class P2P:
    """Non-blocking send/receive of fixed-shape tensors to/from global ranks."""

    def __init__(self, device: torch.device, timeline: Timeline):
        self.device = device
        self.timeline = timeline
        self.is_cuda = device.type == "cuda"
        self.bytes_sent = 0  # payload bytes of every isend so far
        if self.is_cuda:
            self.recv_stream = torch.cuda.Stream(device)
            self.send_stream = torch.cuda.Stream(device)

    def _stream(self, s):
        return torch.cuda.stream(s) if self.is_cuda else nullcontext()

    def irecv(
        self, shape: tuple[int, ...], dtype: torch.dtype, src: int, tag: int, name: str
    ) -> Pending:
        """Post a receive of a ``shape``/``dtype`` tensor from ``src``."""
        with self._stream(self.recv_stream if self.is_cuda else None):
            buf = torch.empty(shape, dtype=dtype, device=self.device)
        return self.irecv_into(buf, src, tag, name)

    def irecv_into(self, buf: torch.Tensor, src: int, tag: int, name: str) -> Pending:
        """Post a receive into ``buf`` (its size and dtype are the message's) from ``src``."""
        with self._stream(self.recv_stream if self.is_cuda else None):
            if self.is_cuda:
                buf.record_stream(self.recv_stream)  # it may come from the compute stream
            work = dist.irecv(buf, src=src, tag=tag)
        return Pending(buf, work, name)

    def isend(self, tensor: torch.Tensor, dst: int, tag: int, name: str) -> Pending:
        """Send ``tensor`` (kept alive by the returned handle) to ``dst`` without blocking."""
        self.bytes_sent += tensor.numel() * tensor.element_size()
        if self.is_cuda:
            ready = torch.cuda.Event()
            ready.record()  # after the compute that produced ``tensor``
            with torch.cuda.stream(self.send_stream):
                self.send_stream.wait_event(ready)
                tensor.record_stream(self.send_stream)
                work = dist.isend(tensor, dst=dst, tag=tag)
        else:
            work = dist.isend(tensor, dst=dst, tag=tag)
        return Pending(tensor, work, name)

    def wait(self, p: Pending) -> torch.Tensor:
        """Complete ``p``; on CUDA the current stream waits, the host does not."""
        with self.timeline.span("wait", p.name):
            p.work.wait()
        if self.is_cuda:
            p.tensor.record_stream(torch.cuda.current_stream(self.device))
        return p.tensor
