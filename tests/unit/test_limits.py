"""Size limits checked before any work: one line naming the key, its limit and the override."""

from __future__ import annotations

import pytest

from system.limits import (
    RANK_PROCESS_BYTES,
    LimitError,
    check_devices,
    check_repeats,
    check_train_memory,
    train_memory_bytes,
)
from system.workload import get_model


def test_device_and_repeat_limits_name_the_key_and_the_override():
    check_devices(1024, what="case x", limit=None)
    with pytest.raises(LimitError) as e:
        check_devices(10_000, what="case x", limit=None)
    assert str(e.value) == (
        "case x has 10000 devices: over limits.max_devices=1024 (link matrices, search and "
        "simulation grow with the square of the device count; set limits.max_devices=10000 to "
        "run anyway)"
    )
    check_devices(10_000, what="case x", limit=10_000)  # the override
    check_repeats(1000, limit=None)
    with pytest.raises(LimitError, match=r"repeats=1000000: over limits.max_repeats=1000 .*"):
        check_repeats(1_000_000, limit=None)
    check_repeats(1_000_000, limit=1_000_000)


def test_train_memory_grows_with_the_model_and_counts_every_rank():
    debug = get_model("debug")
    small = train_memory_bytes(debug, pp=2, dp=2, micro_batch_size=1, micro_batches=4)
    # 4 ranks' interpreters plus at least 16 bytes per parameter (weights, grads, Adam)
    assert small >= 4 * RANK_PROCESS_BYTES + 16 * debug.num_params
    assert small < 4 * RANK_PROCESS_BYTES + 64 * debug.num_params + 64e6
    big = get_model("debug", 100_000)
    need = train_memory_bytes(big, pp=2, dp=2, micro_batch_size=1, micro_batches=4)
    assert need > 2 * 16 * big.num_params  # dp=2 replicas of every parameter
    with pytest.raises(LimitError) as e:
        check_train_memory(big, pp=2, dp=2, micro_batch_size=1, micro_batches=4, limit_gib=64)
    assert "needs about" in str(e.value) and "over limits.max_memory_gib=64" in str(e.value)
    assert "\n" not in str(e.value)
    got = check_train_memory(big, pp=2, dp=2, micro_batch_size=1, micro_batches=4, limit_gib=1e6)
    assert got == pytest.approx(need / 2**30)
