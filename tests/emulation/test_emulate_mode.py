"""``mode=emulate`` end to end on 2 emulated devices (needs root; starts gloo ranks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.emulation._skip import _why_skip

pytestmark = [
    pytest.mark.emulation,
    pytest.mark.dist,
    pytest.mark.slow,
    pytest.mark.skipif(bool(_why_skip()), reason=_why_skip() or "ok"),
]

ROOT = Path(__file__).resolve().parents[2]


def test_emulate_mode_writes_measured_and_simulated_rows(tmp_path):
    pytest.importorskip("torch")
    from hydra import compose, initialize_config_dir

    from repro.config import validate
    from repro.modes.emulate.run import run
    from system.results import read_rows

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "mode=emulate",
                "case=5",
                "model=debug",
                "study=t",
                f"results_dir={tmp_path}",
                "pp=2",
                "dp=1",
                "batch=2",
                "iters=2",
                "devices=[0,24]",
                "layouts=[identity,random]",
                "random_layouts=1",
                "verify_pairs=2",
                "bandwidth_scale=0.1",
                "timeout_s=240",
            ],
        )
    cfg = validate(cfg)
    out = run(cfg)
    assert out["rows"] == 2 and out["verify"]["ok"]
    df = read_rows(tmp_path)
    assert (df["status"] == "ok").all()
    assert (df["iter_time_s"] > 2 * 0.096).all()  # at least one Oregon-Tokyo round trip
    assert (df["predicted_iter_time_s"] > 0).all()
    # the simulator on the same scaled cluster, layout and measured compute predicts the run
    # (the validation in results/emulation gets 2%; 20% leaves room for a busy CI machine)
    assert ((df["predicted_iter_time_s"] / df["iter_time_s"] - 1).abs() < 0.20).all(), df[
        ["iter_time_s", "predicted_iter_time_s", "iter_times_s"]
    ]
    assert (df["warmup_iters"] == 2).all() and (df["iters"] == 3).all()
    if (df["emu_backend"] == "nfqueue").all():
        assert (df["delayer_mean_late_ms"] >= 0).all()
    assert (df["emu_bandwidth_scale"] == 0.1).all() and (df["emu_delay_scale"] == 1.0).all()
    assert set(df["layout"]) == {"identity", "random"}
    rep = json.loads(Path(df["verify_file"].iloc[0]).read_text())
    assert len(rep["pairs"]) == 2
