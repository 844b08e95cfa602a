"""Registration of predictions: the git checks that make a score out-of-sample.

A predictions file is registered by the commit that added it. Scoring is refused (one
ValueError naming the reason) unless that commit is a strict ancestor of the commit that added
the measured rows, the predictions file is unchanged since, and every measured row is later than
the registration, carries this predictions file's hash and ran code containing the registration
commit (:func:`check_registered`). A model change after seeing the scores therefore needs a new
predictions file.
"""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from repro.studies.validation.predict import sha256_file

__all__ = ["registration", "check_registered"]


def _git(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", *args], cwd=root, capture_output=True, text=True, timeout=30, check=check
    )


def _repo_root(path: Path) -> Path:
    p = _git(path.resolve().parent, "rev-parse", "--show-toplevel", check=False)
    if p.returncode:
        raise ValueError(
            f"{path} is not inside a git repository: predictions cannot be registered without one"
        )
    return Path(p.stdout.strip())


def _first_commit(root: Path, path: Path) -> str | None:
    rel = str(path.resolve().relative_to(root))
    p = _git(root, "log", "--diff-filter=A", "--format=%H", "--", rel, check=False)
    lines = p.stdout.split()
    return lines[-1] if lines else None


def _commit_time(root: Path, sha: str) -> datetime:
    ts = int(_git(root, "show", "-s", "--format=%ct", sha).stdout.strip())
    return datetime.fromtimestamp(ts, tz=UTC)


def _is_ancestor(root: Path, a: str, b: str) -> bool:
    return _git(root, "merge-base", "--is-ancestor", a, b, check=False).returncode == 0


def registration(predictions_path: str | Path) -> dict:
    """The predictions file's registration commit and time; raises if it is not registered."""
    path = Path(predictions_path)
    root = _repo_root(path)
    rel = str(path.resolve().relative_to(root))
    reg = _first_commit(root, path)
    if reg is None:
        raise ValueError(
            f"refusing to score: {rel} was never committed (register predictions "
            "by committing them before measuring)"
        )
    later = _git(root, "log", "--format=%H", f"{reg}..HEAD", "--", rel).stdout.split()
    changed = _git(root, "diff", "--quiet", reg, "--", rel, check=False).returncode != 0
    if later or changed:
        raise ValueError(
            f"refusing to score: {rel} changed after its registration commit "
            f"{reg[:10]}; a changed prediction needs a new registered file"
        )
    return {"root": root, "commit": reg, "time": _commit_time(root, reg), "rel": rel}


def check_registered(
    predictions_path: str | Path, measured_path: str | Path, rows: pd.DataFrame
) -> dict:
    """Raise ValueError unless the predictions were registered before every measured row."""
    reg = registration(predictions_path)
    root, sha = reg["root"], reg["commit"]
    mpath = Path(measured_path)
    meas_commit = _first_commit(root, mpath)
    if meas_commit is None:
        raise ValueError(
            f"refusing to score: {mpath} is not committed (commit measured rows as they come)"
        )
    if meas_commit == sha or not _is_ancestor(root, sha, meas_commit):
        raise ValueError(
            f"refusing to score: the predictions' registration commit {sha[:10]} is "
            f"not a strict ancestor of the measured rows' commit {meas_commit[:10]}"
        )
    file_sha = sha256_file(predictions_path)
    bad = []
    for i, r in rows.iterrows():
        when = datetime.strptime(str(r["timestamp_utc"]), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        if when <= reg["time"]:
            bad.append(
                f"row {i} ({r['setting']} {r['system']}): measured {r['timestamp_utc']}, "
                f"not after the registration {reg['time']:%Y-%m-%dT%H:%M:%SZ}"
            )
        elif str(r["predictions_sha256"]) != file_sha:
            bad.append(f"row {i}: measured against another predictions file")
        elif not _is_ancestor(root, sha, str(r["git_revision"])):
            bad.append(
                f"row {i}: measured with code {str(r['git_revision'])[:10]} that does not "
                f"contain the registration commit {sha[:10]}"
            )
    if bad:
        raise ValueError(
            "refusing to score: "
            + "; ".join(bad[:5])
            + (f" (+{len(bad) - 5} more)" if len(bad) > 5 else "")
        )
    return {
        "registration_commit": sha,
        "registration_time_utc": f"{reg['time']:%Y-%m-%dT%H:%M:%SZ}",
        "measured_first_commit": meas_commit,
    }
