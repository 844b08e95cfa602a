"""Per-device training memory: weights, gradients, optimizer state, activations (Rajbhandari et al.,
SC'20: 16 B per parameter with mixed-precision Adam; Korthikanti et al., 2022: activations).

- Mixed-precision Adam: 16 bytes per parameter = fp16 weights 2 + fp16 grads 2 + fp32 master
  weights, momentum and variance 12 (Rajbhandari et al., ZeRO, SC'20). ZeRO-1 shards the 12,
  ZeRO-3 also the weights and grads, over the data-parallel degree.
- Activations (Korthikanti et al., 2022, Table 2, tensor parallel degree t, no sequence
  parallelism), per layer, sequence and micro-batch in flight:

  - ``full`` recomputation keeps only each layer's fp16 input, 2·s·h bytes; one layer is
    recomputed at a time and needs its full working set, s·h·(10 + 24/t + 5·a·s/(h·t)) bytes
    (= s·h·(34 + 5as/h) for t = 1);
  - ``selective`` recomputation keeps everything but the attention scores/softmax/dropout,
    s·h·(10 + 24/t); the one layer being recomputed needs its 5·a·s²/t score bytes;
  - ``none`` keeps the whole working set, s·h·(10 + 24/t + 5·a·s/(h·t)).
- Output layer: fp16 logits + fp32 softmax, 6·s·V/t bytes per sequence, on the last stage.
"""

from __future__ import annotations

from dataclasses import dataclass

from system.workload import GPTConfig

__all__ = ["MemoryEstimate", "training_memory", "RECOMPUTE_MODES"]

RECOMPUTE_MODES = ("full", "selective", "none")  # activation recomputation (Korthikanti et al.)


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes


def training_memory(
    model: GPTConfig,
    *,
    layers: int,
    micro_batch_size: int,
    in_flight: int,
    tp: int = 1,
    embedding: bool = False,
    logits: bool = False,
    weight_shards: int = 1,
    grad_shards: int = 1,
    optimizer_shards: int = 1,
    gathered_layers: int = 0,
    recompute: str = "full",
) -> MemoryEstimate:
    """Memory of one device holding ``layers`` layers (plus the embedding/logits if flagged).

    ``in_flight`` micro-batches keep their layer inputs (GPipe: all of a pass, 1F1B: up to the
    number of stages); ``gathered_layers`` full layers are materialised at once (ZeRO-3);
    ``recompute`` is one of :data:`RECOMPUTE_MODES` (module docstring).
    """
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(
            f"training_memory: recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}"
        )
    if (
        min(layers, micro_batch_size, in_flight, tp, weight_shards, grad_shards, optimizer_shards)
        < 1
    ):
        raise ValueError(
            "training_memory: layers, micro_batch_size, in_flight, tp and shards must be >= 1"
        )
    s, h, a, v = model.seq_length, model.hidden_size, model.num_attention_heads, model.vocab_size
    params = layers * model.params_per_layer / tp
    if embedding or logits:
        params += model.embedding_params / tp
    weights = 2.0 * params / weight_shards + 2.0 * gathered_layers * model.params_per_layer / tp
    grads = 2.0 * params / grad_shards
    optimizer = 12.0 * params / optimizer_shards
    b = micro_batch_size
    full_set = s * h * b * (10.0 + 24.0 / tp + 5.0 * a * s / (h * tp))  # one layer, no recompute
    if recompute == "full":
        stored, working = in_flight * layers * 2.0 * s * h * b, full_set
    elif recompute == "selective":
        stored = in_flight * layers * s * h * b * (10.0 + 24.0 / tp)
        working = 5.0 * a * s * s * b / tp
    else:
        stored, working = in_flight * layers * full_set, 0.0
    out = 6.0 * s * v * b / tp if logits else 0.0
    return MemoryEstimate(weights, grads, optimizer, stored + working + out)
