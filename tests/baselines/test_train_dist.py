"""Each baseline variant trains the debug GPT on 4 CPU ranks (gloo) with falling loss.

DeepSpeed trains our own GPT, so its losses must equal a plain single-process reference (same
weights, data, optimizer) to float tolerance; Megatron's GPTModel has its own initialisation, so
it must start near log(vocab) and fall. Megatron runs through the main entry (row in runs.csv).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

pytestmark = [pytest.mark.baseline, pytest.mark.dist, pytest.mark.slow]

ITERS = 4
ROOT = Path(__file__).resolve().parents[2]


def _reference_losses(iters: int, seed: int = 0, batch: int = 8) -> list[float]:
    """Our GPT trained in one process on the whole global batch: what every layout must match."""
    torch = pytest.importorskip("torch")
    from baselines.grid import BaselineSpec
    from system.runtime.data import SyntheticData
    from system.runtime.model import build_model, lm_loss

    m = BaselineSpec(system="deepspeed").gpt_config()
    model = build_model(m, seed)
    opt = torch.optim.AdamW(
        model.parameters(), lr=BaselineSpec.lr, betas=(0.9, 0.999), weight_decay=0.0
    )
    data = SyntheticData(
        vocab_size=m.vocab_size, seq_length=m.seq_length, global_batch_size=batch, seed=seed
    )
    out = []
    for it in range(iters):
        b = data.batch(it)
        loss = lm_loss(model(b[:, :-1]), b[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(float(loss.detach()))
    return out


def _falling(losses: list[float]) -> bool:
    steps_down = all(b < a for a, b in zip(losses, losses[1:], strict=False))
    return steps_down and losses[-1] < losses[0] - 0.05


@pytest.mark.parametrize("pp, dp, zero", [(1, 4, 3), (2, 2, 1)], ids=["zero3-dp4", "pp2-zero1-dp2"])
def test_deepspeed_matches_reference(tmp_path, pp, dp, zero):
    pytest.importorskip("deepspeed", reason="deepspeed is not installed")
    from baselines.grid import BaselineSpec, run_point

    # the pipeline case also exercises the common wall-clock start of emulated runs, ZeRO-3 the
    # back-to-back iterations of the quality benchmark (one reduction of losses at the end)
    start = "clock" if pp > 1 else "free"
    spec = BaselineSpec(
        system="deepspeed", pp=pp, dp=dp, zero=zero, iters=ITERS, start=start, start_margin_s=0.2
    )
    res = run_point(spec, timeout_s=240, work_dir=tmp_path)
    assert res["status"] == "ok", res.get("error")
    assert _falling(res["losses"]), res["losses"]
    assert res["losses"] == pytest.approx(_reference_losses(ITERS), rel=1e-4)
    assert res["iter_time_s"] > 0 and res["tokens_per_s"] > 0 and res["world_size"] == 4


def test_deepspeed_under_a_moved_rank_map_matches_reference(tmp_path):
    """One process per rank with global rank r on "device" rank_map[r] (a per-device env marks
    where it ran): the rank map moves processes, not the maths, so the losses are launch
    order's (the reference)."""
    pytest.importorskip("deepspeed", reason="deepspeed is not installed")
    from baselines.grid import BaselineSpec, run_point

    rank_map = [2, 0, 3, 1]
    marks = tmp_path / "marks"
    marks.mkdir()
    prefix = [["sh", "-c", f'echo {d} > {marks}/rank$RANK; exec "$@"', "sh"] for d in range(4)]
    env = [{"GLOO_SOCKET_IFNAME": "lo"}] * 4
    spec = BaselineSpec(system="deepspeed", pp=2, dp=2, zero=1, iters=ITERS)
    res = run_point(
        spec,
        timeout_s=240,
        work_dir=tmp_path / "run",
        rank_prefix=prefix,
        rank_env=env,
        rank_map=rank_map,
    )
    assert res["status"] == "ok", res.get("error")
    assert [int((marks / f"rank{r}").read_text()) for r in range(4)] == rank_map
    assert res["losses"] == pytest.approx(_reference_losses(ITERS), rel=1e-4)


def test_megatron_pp2_dp2_through_main_entry(tmp_path):
    pytest.importorskip("megatron.core", reason="megatron-core is not installed")
    from hydra import compose, initialize_config_dir

    from repro.run import run

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "mode=train",
                "system=megatron",
                "model=debug",
                "pp=2",
                "dp=2",
                f"iters={ITERS}",
                f"results_dir={tmp_path}",
                "timeout_s=240",
            ],
        )
    out = run(cfg)
    assert out["status"] == "ok"
    assert _falling(out["losses"]), out["losses"]
    assert abs(out["losses"][0] - math.log(512)) < 0.15  # random init: about log(vocab)
    rows = pd.read_csv(tmp_path / "runs.csv")
    assert len(rows) == 1
    row = rows.iloc[0]
    assert (row.status, row.system, row.pp, row.dp, row.tp, row.num_devices) == (
        "ok",
        "megatron",
        2,
        2,
        1,
        4,
    )
    assert row.iter_time_s > 0 and row.pflops > 0


def test_megatron_interleaved_and_overlapped_grad_reduce_train(tmp_path):
    # megatron-core's interleaved 1F1B (2 chunks per stage) on pp2 x dp2 trains with falling
    # loss from about log(vocab); overlapping the gradient reduction with backward (bucketed,
    # in the last micro-batch) changes when the gradients are reduced, not what they are
    pytest.importorskip("megatron.core", reason="megatron-core is not installed")
    from baselines.grid import BaselineSpec, run_point

    def losses(**kw) -> list[float]:
        spec = BaselineSpec(system="megatron", pp=2, dp=2, global_batch_size=8, iters=ITERS, **kw)
        out = run_point(spec, timeout_s=240, work_dir=tmp_path / spec.label().replace(" ", "_"))
        assert out["status"] == "ok", out
        return out["losses"]

    interleaved = losses(virtual_stages=2)
    assert _falling(interleaved), interleaved
    assert abs(interleaved[0] - math.log(512)) < 0.15
    assert losses(virtual_stages=2, overlap_grad_reduce=True) == pytest.approx(
        interleaved, rel=1e-5
    )
    plain = losses()
    assert losses(overlap_grad_reduce=True) == pytest.approx(plain, rel=1e-5)
