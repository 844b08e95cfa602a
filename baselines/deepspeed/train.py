"""DeepSpeed baseline worker: one process per rank, ``python -m baselines.deepspeed.train SPEC``.

Trains OUR GPT (system/runtime/model.py, same weights for the same seed) with DeepSpeed, in the two
variants the paper grid-searches (§4):

* ``pp == 1`` — ZeRO stage ``zero`` (0..3) over the whole model, ``dp`` ranks; each rank runs its
  micro-batches with gradient accumulation, ``engine.step()`` at the boundary.
* ``pp > 1`` — ``PipelineModule`` over ``[Embedding, Block…, Head]`` cut uniformly into ``pp``
  stages (the same slices as our runtime), ``dp`` pipelines (PipeDataParallelTopology: rank =
  stage·DP + replica), ZeRO stage 0 or 1, DeepSpeed's 1F1B ``train_batch``.

The DeepSpeed config is built in code (:func:`ds_config`). The optimizer is plain
``torch.optim.AdamW`` (DeepSpeed's own Adam would JIT-compile an op). On CPU the backend is gloo
and the inference-only shared-memory op is skipped before init; on CUDA it is NCCL. The ranks
read torchrun's environment (:func:`system.runtime.launch.run_ranks` starts them under torchrun,
or one torchrun agent per host on several hosts).
"""

from __future__ import annotations

import logging
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from baselines import worker as wc  # noqa: E402
from baselines.spec import BaselineSpec  # noqa: E402
from system.lifeline import exit_now  # noqa: E402
from system.runtime.model import build_model, layer_list, lm_loss  # noqa: E402

log = logging.getLogger(__name__)

__all__ = ["ds_config", "train", "main"]


def ds_config(spec: BaselineSpec) -> dict:
    """The DeepSpeed JSON config for ``spec`` (batch accounting: G = dp · mb · accumulation)."""
    accumulation = spec.global_batch_size // (spec.dp * spec.micro_batch_size)
    cfg = {
        "train_batch_size": spec.global_batch_size,
        "train_micro_batch_size_per_gpu": spec.micro_batch_size,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": 0.0,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": int(spec.zero)},
    }
    if spec.dp_collective == "tree+allgather":  # all-reduce the gradients, then all-gather
        cfg["zero_optimization"]["reduce_scatter"] = False
    if spec.overlap_comm is not None:  # ZeRO: reduce buckets as backward fills them
        cfg["zero_optimization"]["overlap_comm"] = bool(spec.overlap_comm)
    if spec.zero == 3:
        # small models: keep every parameter partitioned (no persistence threshold shortcut)
        cfg["zero_optimization"].update({"stage3_param_persistence_threshold": 0})
    if spec.pp > 1:
        cfg["pipeline"] = {"activation_checkpoint_interval": 1 if spec.recompute else 0}
    return cfg


def _import_deepspeed():
    """Import DeepSpeed without compiling its inference-only shared-memory op."""
    import deepspeed.comm.torch  # noqa: F401

    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    import deepspeed

    return deepspeed


def _train_zero(ds, spec: BaselineSpec, device: torch.device) -> tuple[list[float], list[float]]:
    model = build_model(spec.gpt_config(), spec.seed).to(device)
    model.checkpoint = spec.recompute
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.999), weight_decay=0.0)
    engine, _, _, _ = ds.initialize(model=model, optimizer=opt, config=ds_config(spec))
    dp_rank, dp_size = dist.get_rank(), dist.get_world_size()
    clock = wc.StepClock(device, spec, dp_size)
    for it in range(spec.iters):
        micro = wc.replica_micro_batches(spec, it, dp_rank, dp_size)
        total = torch.zeros((), dtype=torch.float64)
        with clock.iteration():
            for inputs, targets in micro:
                loss = lm_loss(engine(inputs.to(device)), targets.to(device))
                engine.backward(loss)  # DeepSpeed scales by 1/accumulation itself
                engine.step()  # steps the optimizer only at the accumulation boundary
                total += loss.detach().double().cpu()
        clock.record(total / len(micro))
    return clock.result()


def _train_pipeline(
    ds, spec: BaselineSpec, device: torch.device
) -> tuple[list[float], list[float]]:
    from deepspeed.pipe import PipelineModule

    layers = layer_list(spec.gpt_config(), spec.seed)
    module = PipelineModule(
        layers=layers,
        num_stages=spec.pp,
        loss_fn=lm_loss,
        partition_method="uniform",
        activation_checkpoint_interval=1 if spec.recompute else 0,
    )
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=spec.lr, betas=(0.9, 0.999), weight_decay=0.0)
    engine, _, _, _ = ds.initialize(model=module, optimizer=opt, config=ds_config(spec))
    grid = engine.grid
    dp_rank, dp_size = grid.get_data_parallel_rank(), grid.get_data_parallel_world_size()
    is_last = engine.is_last_stage()
    clock = wc.StepClock(device, spec, dp_size)
    for it in range(spec.iters):
        micro = [
            (x.to(device), y.to(device))
            for x, y in wc.replica_micro_batches(spec, it, dp_rank, dp_size)
        ]
        with clock.iteration():
            loss = engine.train_batch(data_iter=iter(micro))  # mean over micro-batches and DP
        # train_batch already averaged over DP; every replica's last stage adds it once
        clock.record(loss if is_last else None)
    return clock.result()


def train(spec: BaselineSpec) -> dict:
    """Train ``spec.iters`` iterations; returns the metrics (the same on every rank)."""
    ds = _import_deepspeed()
    device = wc.init_distributed(spec)
    ds.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo")
    run = _train_pipeline if spec.pp > 1 else _train_zero
    losses, times = run(ds, spec, device)
    return wc.metrics(spec, losses, times)


def main(argv: list[str]) -> int:
    spec = wc.load_spec(argv, expect_system="deepspeed")
    try:
        wc.write_result(spec, train(spec))
    finally:
        wc.shutdown()
    return 0


if __name__ == "__main__":
    exit_now(main(sys.argv[1:]))  # results written, group destroyed: skip finalization
