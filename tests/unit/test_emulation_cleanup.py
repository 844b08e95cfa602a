"""The emulation's cleanup removes its own stale state folders and nothing else under the prefix."""

from __future__ import annotations

import json
import os

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


def test_a_reused_pid_is_not_the_owner(tmp_path, monkeypatch):
    """Ownership is a pid and its start time: a live process that took a dead owner's pid
    does not keep that owner's network alive."""
    from system.lifeline import process_start_time

    monkeypatch.setattr(cleanup_mod, "STATE_ROOT", tmp_path)
    monkeypatch.setattr(cleanup_mod, "netns_list", lambda: ["dtfm-reused-d0", "dtfm-mine-d0"])
    me = os.getppid()  # alive, and not this process (whose own state is never its leftover)
    for tag, start in (("reused", process_start_time(me) - 1), ("mine", process_start_time(me))):
        (tmp_path / f"dtfm-{tag}").mkdir()
        (tmp_path / f"dtfm-{tag}" / "state.json").write_text(
            json.dumps(
                {
                    "owner_pid": me,
                    "owner_start": start,
                    "tag": tag,
                    "namespaces": [f"dtfm-{tag}-d0"],
                }
            )
        )
    out = cleanup_mod.cleanup(dry_run=True)
    assert out["namespaces"] == ["dtfm-reused-d0"]
    assert out["state_dirs"] == [str(tmp_path / "dtfm-reused")]


def test_default_tags_are_unique_and_not_the_pid():
    from system.cases import get_case
    from system.emulation.plan import make_plan

    c = get_case("debug").subset([0, 2])
    tags = {make_plan(c).tag for _ in range(50)}
    assert len(tags) == 50
    assert f"{os.getpid() % 100000:x}" not in tags
