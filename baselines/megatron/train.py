"""Megatron-core baseline worker: one process per rank, ``python -m baselines.megatron.train SPEC``.

Trains megatron-core's own ``GPTModel`` shaped like our GPT (same layers, hidden size, heads,
sequence length, vocabulary, untied output layer as in system/runtime/model.py, no dropout) on
the same batches as every other system (synthetic, or the corpus), with Megatron's 1F1B
pipeline schedule (``get_forward_backward_func``), its tensor/pipeline/data-parallel groups
(``initialize_model_parallel``; rank = tp + TP·(dp + DP·pp)), its DDP wrapper (gradient
all-reduce per DP group) and its optimizer (``get_megatron_optimizer``, which falls back to
``torch.optim.AdamW`` without Apex/TE). Paper §4 compares against Megatron
tuned by grid search; :mod:`baselines.grid` runs the grid.

The spec's framework features reach megatron-core as Megatron-LM's training loop passes them
(:func:`megatron_options`): ``virtual_stages`` > 1 builds that many model chunks per stage
(``vp_stage``) and runs the interleaved 1F1B schedule; ``distributed_optimizer``,
``overlap_grad_reduce`` and ``overlap_param_gather`` go to ``DistributedDataParallelConfig``
(and the optimizer's ``use_distributed_optimizer``); with overlap the schedule gets each chunk's
``no_sync`` and ``start_grad_sync`` so that buckets are reduced in the last micro-batch only.

On CPU (gloo) :mod:`baselines.megatron.cpu_shim` answers Megatron's CUDA calls; on CUDA (NCCL)
nothing is patched. The environment is torchrun's (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
LOCAL_RANK): :func:`system.runtime.launch.run_ranks` starts the ranks under torchrun (or sets the
same variables per rank in network namespaces), and on several hosts one torchrun agent per host
runs this module; rank 0 writes the metrics JSON named by the spec.
"""

from __future__ import annotations

import logging
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from baselines import worker as wc  # noqa: E402
from baselines.spec import BaselineSpec  # noqa: E402
from system.lifeline import exit_now  # noqa: E402

log = logging.getLogger(__name__)


def megatron_options(spec: BaselineSpec) -> dict:
    """What ``spec`` asks of megatron-core: ``ddp`` (``DistributedDataParallelConfig``'s
    arguments), ``use_distributed_optimizer`` (``OptimizerConfig``'s) and
    ``virtual_pipeline_model_parallel_size`` (None without interleaving). The two-level
    collective is megatron-core's partial distributed optimizer."""
    distributed = spec.distributed_optimizer or spec.dp_collective == "two_level"
    return {
        "ddp": {
            "grad_reduce_in_fp32": True,
            "overlap_grad_reduce": spec.overlap_grad_reduce,
            "overlap_param_gather": spec.overlap_param_gather,
            "use_distributed_optimizer": distributed,
            "num_distributed_optimizer_instances": spec.dist_opt_instances,
        },
        "use_distributed_optimizer": distributed,
        "virtual_pipeline_model_parallel_size": (
            spec.virtual_stages if spec.virtual_stages > 1 else None
        ),
    }


def _build(spec: BaselineSpec, device: torch.device):
    """Model chunks (each wrapped in Megatron DDP), optimizer and the Megatron config for this
    rank."""
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer import TransformerConfig

    from baselines.megatron import cpu_shim

    options = megatron_options(spec)
    virtual = options["virtual_pipeline_model_parallel_size"]
    ps.initialize_model_parallel(
        tensor_model_parallel_size=spec.tp,
        pipeline_model_parallel_size=spec.pp,
        virtual_pipeline_model_parallel_size=virtual,
        num_distributed_optimizer_instances=spec.dist_opt_instances,
    )
    cpu_shim.install(spec.seed, use_cpu=device.type == "cpu")
    m = spec.gpt_config()
    config = TransformerConfig(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads,
        ffn_hidden_size=m.ffn_mult * m.hidden_size,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=spec.tp,
        pipeline_model_parallel_size=spec.pp,
        virtual_pipeline_model_parallel_size=virtual,
        pipeline_dtype=torch.float32,
        params_dtype=torch.float32,
        use_cpu_initialization=device.type == "cpu",
        perform_initialization=True,
        gradient_accumulation_fusion=False,
        masked_softmax_fusion=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        sequence_parallel=False,
        recompute_granularity="full" if spec.recompute else None,
        recompute_method="uniform" if spec.recompute else None,
        recompute_num_layers=1 if spec.recompute else None,
    )
    ddp_config = DistributedDataParallelConfig(**options["ddp"])
    chunks = []
    for vp in range(virtual) if virtual else [None]:
        model = GPTModel(
            config=config,
            transformer_layer_spec=get_gpt_layer_local_spec(),
            vocab_size=m.vocab_size,
            max_sequence_length=m.seq_length,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
            share_embeddings_and_output_weights=False,
            position_embedding_type="learned_absolute",
            vp_stage=vp,
        ).to(device)
        chunks.append(
            DistributedDataParallel(
                config=config,
                ddp_config=ddp_config,
                module=model,
                disable_bucketing=bool(vp),  # as Megatron-LM: buckets in the first chunk only
            )
        )
    config.finalize_model_grads_func = finalize_model_grads
    if spec.overlap_grad_reduce:  # reduce in the last micro-batch only, chunk by chunk
        no_sync = [c.no_sync for c in chunks]
        grad_sync = [c.start_grad_sync for c in chunks]
        config.no_sync_func = no_sync if virtual else no_sync[0]
        config.grad_sync_func = grad_sync if virtual else grad_sync[0]
    opt_config = OptimizerConfig(
        optimizer="adam",
        lr=spec.lr,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        clip_grad=0.0,
        fp16=False,
        bf16=False,
        use_distributed_optimizer=options["use_distributed_optimizer"],
    )
    optimizer = get_megatron_optimizer(opt_config, chunks)
    return chunks, optimizer, config


def train(spec: BaselineSpec) -> dict:
    """Train ``spec.iters`` iterations; returns this rank's metrics (rank 0's are the run's)."""
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    device = wc.init_distributed(spec)
    chunks, optimizer, _ = _build(spec, device)
    m = spec.gpt_config()
    dp_rank, dp_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
    # one loss holder per replica: the last stage's tensor-parallel rank 0
    holds_loss = ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0
    position_ids = torch.arange(m.seq_length, device=device).unsqueeze(0)
    forward_backward = get_forward_backward_func()

    def forward_step(data_iterator, model_chunk):
        inputs, labels = (t.to(device).contiguous() for t in next(data_iterator))
        pos = position_ids.expand(inputs.shape[0], -1)
        out = model_chunk(inputs, pos, None, labels=labels)  # last stage: per-token loss (b, s)

        def loss_func(output_tensor):
            loss = output_tensor.float().mean()
            return loss, {"lm loss": loss.detach().clone()}  # the schedule scales loss in place

        return out, loss_func

    clock = wc.StepClock(device, spec, dp_size)
    for it in range(spec.iters):
        micro = wc.replica_micro_batches(spec, it, dp_rank, dp_size)
        for chunk in chunks:
            chunk.zero_grad_buffer()
        optimizer.zero_grad()
        # one iterator per chunk: each chunk's forward step draws its micro-batches in order
        data = [iter(micro) for _ in chunks] if len(chunks) > 1 else iter(micro)
        with clock.iteration():
            out = forward_backward(
                forward_step_func=forward_step,
                data_iterator=data,
                model=chunks,
                num_microbatches=len(micro),
                seq_length=m.seq_length,
                micro_batch_size=spec.micro_batch_size,
                forward_only=False,
            )
            ok, _, _ = optimizer.step()
            if not ok:
                raise RuntimeError(f"megatron: optimizer step skipped at iteration {it}")
        local = torch.stack([d["lm loss"] for d in out]).mean() if holds_loss else None
        clock.record(local)
    return wc.metrics(spec, *clock.result())


def main(argv: list[str]) -> int:
    spec = wc.load_spec(argv, expect_system="megatron")
    try:
        result = train(spec)
        wc.write_result(spec, result)
    finally:
        try:
            from megatron.core import parallel_state as ps

            ps.destroy_model_parallel()
        except Exception:  # noqa: BLE001 - best effort cleanup on the way out
            pass
        wc.shutdown()
    return 0


if __name__ == "__main__":
    exit_now(main(sys.argv[1:]))  # results written, group destroyed: skip finalization
