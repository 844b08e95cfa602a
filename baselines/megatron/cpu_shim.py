"""Run megatron-core on CPU with gloo: a small, explicit CUDA -> CPU shim.

megatron-core 0.16 assumes a GPU in a few places that matter for training a GPT with pipeline and
data parallelism (found by reading the code and running it):

1. ``torch.cuda.current_device()`` names the device for p2p shape tensors, gradient buffers and
   loss counters; ``torch.cuda.synchronize()`` follows each batched p2p exchange.
2. The schedules create tensors with ``device="cuda"`` (token counters) and some helpers call
   ``Tensor.cuda()``.
3. Dropout runs inside the CUDA RNG tracker (``get_cuda_rng_tracker().fork()``).

The shim answers each one and changes nothing else:

1. ``torch.cuda.current_device`` returns 0 and ``torch.cuda.synchronize`` is a no-op;
2. a :class:`torch.overrides.TorchFunctionMode` rewrites every ``device=`` argument that names
   CUDA (a string, a ``torch.device`` or a bare int index) to CPU, and ``Tensor.cuda()`` returns
   the tensor unchanged;
3. the RNG tracker is re-created as Megatron's "inference" tracker, whose ``fork()`` is a null
   context: dropout (off in our runs) then draws from torch's seeded CPU generator.

On a machine with CUDA the shim is not installed (:func:`install` is a no-op when
``use_cpu=False``): Megatron runs unchanged with NCCL.
"""

from __future__ import annotations

import logging

import torch
from torch.overrides import TorchFunctionMode

log = logging.getLogger(__name__)

__all__ = ["install", "is_installed", "CpuDeviceMode"]

_STATE: dict = {"mode": None, "saved": None}


def _to_cpu_device(dev):
    """``dev`` rewritten to CPU when it names CUDA (or is a bare device index), else unchanged."""
    if isinstance(dev, bool):
        return dev
    if isinstance(dev, int):
        return torch.device("cpu")
    if isinstance(dev, str) and dev.startswith("cuda"):
        return torch.device("cpu")
    if isinstance(dev, torch.device) and dev.type == "cuda":
        return torch.device("cpu")
    return dev


class CpuDeviceMode(TorchFunctionMode):
    """Rewrite ``device=`` keyword arguments naming CUDA to CPU, for every torch function call."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "device" in kwargs:
            kwargs = dict(kwargs, device=_to_cpu_device(kwargs["device"]))
        return func(*args, **kwargs)


def _tensor_cuda_noop(self, *args, **kwargs):
    return self


def is_installed() -> bool:
    return _STATE["mode"] is not None


def install(seed: int, *, use_cpu: bool = True) -> None:
    """Install the shim (idempotent); call after ``initialize_model_parallel``, before the model.

    ``seed`` seeds torch's CPU generator (the tracker's fork draws from it). With
    ``use_cpu=False`` this only seeds, the Megatron way (``model_parallel_cuda_manual_seed``).
    """
    from megatron.core import tensor_parallel

    if not use_cpu:
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
        return
    if not is_installed():
        _STATE["saved"] = (torch.cuda.current_device, torch.cuda.synchronize, torch.Tensor.cuda)
        torch.cuda.current_device = lambda: 0
        torch.cuda.synchronize = lambda *a, **k: None
        torch.Tensor.cuda = _tensor_cuda_noop
        mode = CpuDeviceMode()
        mode.__enter__()
        _STATE["mode"] = mode
        log.debug("megatron CPU shim installed")
    torch.manual_seed(seed)
    tensor_parallel.random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)


def uninstall() -> None:
    """Undo :func:`install` (tests use it; a worker process simply exits)."""
    if not is_installed():
        return
    _STATE["mode"].__exit__(None, None, None)
    torch.cuda.current_device, torch.cuda.synchronize, torch.Tensor.cuda = _STATE["saved"]
    _STATE["mode"] = None
    _STATE["saved"] = None
