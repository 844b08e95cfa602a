"""Shared test setup: hypothesis profiles, environment for torch processes, skip helpers."""

from __future__ import annotations

import os
import shutil

import pytest
from hypothesis import settings

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

try:  # conf/config.yaml composes on the typed schema that repro/config.py registers with Hydra
    import repro.config  # noqa: F401
except ImportError:  # pragma: no cover - a checkout without repro/config.py
    pass

# Property tests without their own max_examples draw 15 examples in a local run and 60 in CI
# (.ci/run sets CI=1); a test that caps its examples for cost sets max_examples itself.
settings.register_profile("default", max_examples=15, deadline=None)
settings.register_profile("ci", max_examples=60, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "default")


def has_root_netns() -> tuple[bool, str]:
    """Whether this process can create network namespaces and use tc (root + iproute2)."""
    if os.geteuid() != 0:
        return False, "needs root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return False, "needs iproute2 (ip, tc)"
    return True, ""


needs_root_netns = pytest.mark.skipif(not has_root_netns()[0], reason=has_root_netns()[1] or "ok")


@pytest.fixture
def tmpfs(tmp_path):
    """``tmpfs(name, size="1m")``: a small tmpfs mounted at ``tmp_path / name`` for the test
    (a full disk, a read-only folder), unmounted after it; skips without root."""
    import contextlib

    from repro.checks.probe_inputs.probe_runs import NotRun
    from repro.checks.probe_inputs.probe_runs import tmpfs as mount

    with contextlib.ExitStack() as stack:

        def make(name: str, size: str = "1m"):
            try:
                return stack.enter_context(mount(tmp_path / name, size=size))
            except NotRun as e:
                pytest.skip(str(e))

        yield make
