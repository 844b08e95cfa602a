"""A hand-made Sailor data set: one 4-layer model "OPT-350" (shape shrunk), GH-96 nodes of one
GPU, flat 1 GB/s links. Small enough to time by hand (see test_sailor_framework.py)."""

from __future__ import annotations

import json
from pathlib import Path

FWD = [0.01, 0.1, 0.1, 0.05]
BWD = [0.0, 0.2, 0.2, 0.1]
OPT_S = 0.004
PARAMS = [100e6, 10e6, 10e6, 100e6]
ACT_OUT = 1e6  # elements per sequence, every layer


def write_data(root: Path, *, profiles=None, llm=None, fits=None) -> Path:
    """Write the five data files under ``root`` (a plans folder goes in ``root/plans``)."""
    root.mkdir(parents=True, exist_ok=True)
    layers = {str(i): [FWD[i], BWD[i], OPT_S] for i in range(4)}
    prof = {"OPT-350": {"GH-96": {"1": {"1": layers}}}}
    sizes = {
        "OPT-350": {
            "1": {
                str(i): {
                    "params_floats": PARAMS[i],
                    "act_output_floats": ACT_OUT,
                    "act_mem_floats": 2e6,
                }
                for i in range(4)
            }
        }
    }
    z = "us-central1-a"
    flat = [[0.0, 0.0, 1.0], 1e9]  # 1 GB/s at every size, peak 1e9 bytes/s
    bw = {z: {"GH-96": {"1": {z: {"GH-96": {"1": flat}}}}}}
    (root / "profiles_tmp.json").write_text(json.dumps(prof if profiles is None else profiles))
    (root / "llm_info.json").write_text(json.dumps(sizes if llm is None else llm))
    (root / "multizone_bandwidths_het.json").write_text(json.dumps(bw if fits is None else fits))
    (root / "intra_node_bandwidths.json").write_text(json.dumps({"GH-96": {"2": flat}}))
    for name, model, layers_ in (
        ("training_config_opt_350.json", "OPT-350", 2),
        ("training_config_gpt_neo27.json", "GPT-Neo-2.7", 32),
    ):
        cfg = {
            "hidden_size": 64,
            "sequence_length": 128,
            "num_layers": layers_,
            "num_all_layers": layers_ + 2,
            "vocab_size": 1000,
            "heads": 4,
            "model": model,
        }
        (root / name).write_text(json.dumps(cfg))
    return root


def plan(stages: list[list[int]], dp: int, *, mbs=1, gbs=1, real=None, gpu="GH-96") -> dict:
    def rep():
        return [[[gpu, 1, "us-central1-a"]], 1]

    d = {
        "zone": "us-central1-a",
        "pipeline_list": [
            {
                "num_stages": len(stages),
                "layers_per_stage": stages,
                "tmp_per_stage": [[rep() for _ in range(dp)] for _ in stages],
                "dp": [dp] * len(stages),
            }
        ],
        "mbs": mbs,
        "gbs": gbs,
        "N": len(stages) * dp,
    }
    if real is not None:
        d["real"] = real
    return d


def write_plan(root: Path, rel: str, d: dict) -> Path:
    p = root / "plans" / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(d))
    return p
