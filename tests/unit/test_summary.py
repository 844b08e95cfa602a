"""The console summary of a simulated setting (repro/report/summary.py)."""

from __future__ import annotations

import pandas as pd

from repro.report.summary import print_compact, with_speedups


def _line(**kw) -> dict:
    line = {
        "case": "5",
        "num_layers": 40,
        "global_batch_size": 1024,
        "link_sharing": "tc_class",
        "baseline_placement": "topology",
        "ours_iter_time_s": 28.0,
        "ours_random_iter_time_s": 65.0,
        "ours_search_iter_time_s": 26.0,
        "ours_search_config": "tp1/pp4/dp16 mbs1 rc-selective 1f1b [one_pipeline_per_region]",
        "ours_search_layout": "one_pipeline_per_region",
        "ours_search_dp_collective": "sharded_ps",
        "megatron_iter_time_s": 34.0,
        "megatron_config": "tp1/pp4/dp16 mbs1 rc-selective",
        "megatron_dp_collective": "two_level/tree",
        "megatron_launch_iter_time_s": 58.0,
        "megatron_launch_config": "tp1/pp4/dp16 mbs4",
        "megatron_launch_dp_collective": "two_level/ring",
        "deepspeed_iter_time_s": 52.0,
        "deepspeed_config": "tp1/pp1/dp64 mbs1 zero3 rc-selective",
        "deepspeed_dp_collective": "tree+allgather",
        "deepspeed_launch_iter_time_s": 96.0,
        "deepspeed_launch_config": "tp1/pp8/dp8 mbs8 zero1 rc-selective",
        "deepspeed_launch_dp_collective": "ring",
    }
    return {**line, **kw}


def test_compact_table_fits_100_columns_without_cutting_a_cell(capsys):
    summary = with_speedups(
        pd.DataFrame([_line(), _line(link_sharing="nic", megatron_iter_time_s=20.0)]), {}
    )
    print_compact(summary, 1.0, width=100)
    out = capsys.readouterr().out
    lines = out.splitlines()
    # bytes, as a byte-counting awk sees them; nothing cut ("…") and nothing wrapped
    assert max(len(ln.encode()) for ln in lines) <= 100, out
    assert "…" not in out
    for cell in ("tp1/pp1/dp64 mbs1 zero3 rc-selective; tree+allgather", "pipe/region"):
        assert cell in out
    # a header line per setting names its link-sharing model
    assert "case 5, 40 layers, batch 1024, link sharing nic" in out
    # ours' best configuration against each baseline's best, and the paper's shape
    assert (
        "ours/Megatron   paper's shape 1.21x topo, 2.07x launch | best vs best 1.31x topo, "
        "2.23x launch" in out
    )
    assert "best vs best 0.77x topo" in out  # the nic line: Megatron at 20 s


def test_a_grid_pick_is_the_marked_row_else_the_fastest_ok_one():
    """Each baseline's pick: the ok row marked ``is_best``; without one, the fastest ok row (the
    first of equals), never a faster row that did not fit; no ok row: no pick."""
    from repro.report.summary import summary_from_rows

    def row(system, config, it, status="ok", **kw):
        return {
            "mode": "simulate",
            "case": "5",
            "num_layers": 24,
            "global_batch_size": 1024,
            "system": system,
            "placement": "launch" if system in ("megatron", "deepspeed") else "scheduled",
            "status": status,
            "iter_time_s": it,
            "pflops": 1.0 / it if it else None,
            "config": config,
            "sim_pipeline_s": it,
            "sim_dp_sync_s": None,
            "is_best": kw.pop("is_best", None),
            **kw,
        }

    rows = pd.DataFrame(
        [
            row("ours", "paper", 10.0),
            row("ours_random", "random", 20.0),
            row("ours_search", "fast", 8.0, is_best=False),
            row("ours_search", "marked", 9.0, is_best=True),
            row("megatron", "oom-fast", None, status="oom"),
            row("megatron", "first", 30.0),
            row("megatron", "second", 30.0),
            row("megatron", "slow", 40.0),
            row("deepspeed", "oom", None, status="oom"),
        ]
    )
    line = summary_from_rows(rows).iloc[0]
    assert line.ours_search_config == "marked" and line.ours_search_iter_time_s == 9.0
    assert line.megatron_config == "first" and line.megatron_iter_time_s == 30.0
    assert line.megatron_why == (
        "first: 30.0 s (pipeline 30.0 s, DP 0.0 s); runner-up second 30.0 s (pipeline 30.0 s, "
        "DP 0.0 s); 3 feasible, 1 over memory"
    )
    assert pd.isna(line.deepspeed_config) and pd.isna(line.deepspeed_why)
