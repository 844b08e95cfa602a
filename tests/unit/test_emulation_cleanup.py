"""The emulation's cleanup removes its own stale state folders and nothing else under the prefix."""

from __future__ import annotations

import json

from system.emulation import cleanup as cleanup_mod


def test_cleanup_keeps_folders_that_are_not_emulation_state(tmp_path, monkeypatch):
    monkeypatch.setattr(cleanup_mod, "STATE_ROOT", tmp_path)
    monkeypatch.setattr(cleanup_mod, "netns_list", lambda: [])
    stale = tmp_path / "dtfm-old"  # an emulation whose owner is gone
    stale.mkdir()
    (stale / "state.json").write_text(json.dumps({"owner_pid": 2**22 + 7, "namespaces": []}))
    for other in ("dtfm-slurm", "dtfm-run-abc"):  # Slurm's state, a runtime run's logs
        (tmp_path / other).mkdir()
        (tmp_path / other / "slurmctld.pid").write_text("1")
    out = cleanup_mod.cleanup(dry_run=True)
    assert out["state_dirs"] == [str(stale)]
