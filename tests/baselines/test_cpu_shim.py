"""The megatron-core CUDA -> CPU shim: what it rewrites, and that it undoes itself."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.baseline


def test_shim_rewrites_cuda_devices_and_restores():
    # imported here, not at module level: megatron-core takes seconds to import, and collection
    # imports this module even when the default run deselects the baseline tier
    pytest.importorskip("megatron.core", reason="megatron-core is not installed")
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("the shim is for machines without CUDA")
    from baselines.megatron import cpu_shim

    saved = torch.cuda.current_device
    cpu_shim.install(seed=0)
    try:
        assert cpu_shim.is_installed()
        assert torch.zeros(2, device="cuda").device.type == "cpu"
        assert torch.ones(1, device=torch.cuda.current_device()).device.type == "cpu"
        assert torch.empty(3, device=torch.device("cuda", 0)).device.type == "cpu"
        t = torch.arange(3)
        assert t.cuda() is t
        torch.cuda.synchronize()  # a no-op, not an error
        from megatron.core import tensor_parallel

        with tensor_parallel.get_cuda_rng_tracker().fork():
            torch.rand(1)
        cpu_shim.install(seed=0)  # idempotent
    finally:
        cpu_shim.uninstall()
    assert not cpu_shim.is_installed()
    assert torch.cuda.current_device is saved
    with pytest.raises((RuntimeError, AssertionError)):
        torch.zeros(1, device="cuda")
