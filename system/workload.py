"""GPT workload: model shape, batch, precision, and the sizes/FLOPs derived from them.

Field names follow Megatron (``num_layers``, ``hidden_size``, ...) so baseline launchers map 1:1.
Sources: parameter count 12·h² + 13·h per layer (GPT-2/3 layer: QKV + proj + 2 MLP matrices,
biases, 2 LayerNorms); FLOPs from Narayanan et al., SC'21 (appendix).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

__all__ = [
    "GPTConfig",
    "Workload",
    "TaskletSizes",
    "MODELS",
    "PAPER_LAYERS",
    "PAPER_BATCH_SIZES",
    "get_model",
    "tasklet_sizes",
    "stage_gradient_params",
    "DTFM_REFERENCE",
    "WORKLOADS",
    "get_workload",
]

GPT2_VOCAB = 50257


@dataclass(frozen=True, slots=True, kw_only=True)
class GPTConfig:
    """Shape of a GPT model (Megatron field names)."""

    name: str = "gpt"
    num_layers: int = 24
    hidden_size: int = 2048
    num_attention_heads: int = 16
    seq_length: int = 2048
    vocab_size: int = GPT2_VOCAB
    ffn_mult: int = 4  # MLP hidden = ffn_mult · hidden_size

    def __post_init__(self) -> None:
        for k in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size"):
            if getattr(self, k) < 1:
                raise ValueError(f"model {self.name!r}: {k} must be >= 1, got {getattr(self, k)}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"model {self.name!r}: hidden_size {self.hidden_size} is not divisible by "
                f"num_attention_heads {self.num_attention_heads}"
            )

    @property
    def params_per_layer(self) -> int:
        h, f = self.hidden_size, self.ffn_mult
        return (4 + 2 * f) * h * h + (9 + f) * h  # = 12h² + 13h for f = 4

    @property
    def embedding_params(self) -> int:
        return (self.vocab_size + self.seq_length) * self.hidden_size  # tied output layer

    @property
    def num_params(self) -> int:
        layers = self.num_layers * self.params_per_layer
        return layers + self.embedding_params + 2 * self.hidden_size

    def with_layers(self, num_layers: int) -> GPTConfig:
        return replace(self, num_layers=num_layers)


# The paper's Fig. 3 grid: GPT3-XL at these depths and global batch sizes (sequences), §4.1.
PAPER_LAYERS = (24, 32, 40)
PAPER_BATCH_SIZES = (1024, 2048, 4096)

MODELS: dict[str, GPTConfig] = {
    # GPT3-1.3B (GPT3 "XL"): the paper's model; layers vary over PAPER_LAYERS.
    "gpt3_xl": GPTConfig(
        name="gpt3_xl",
        num_layers=24,
        hidden_size=2048,
        num_attention_heads=16,
        seq_length=2048,
        vocab_size=GPT2_VOCAB,
    ),
    # The models of Sailor's planner studies (Strati et al., SOSP'25; its training configs):
    # OPT-350M (Zhang et al. 2022) and GPT-Neo 2.7B (EleutherAI; GPT-2's vocabulary, as the
    # layer sizes of Sailor's profiles count it).
    "opt_350": GPTConfig(
        name="opt_350",
        num_layers=24,
        hidden_size=1024,
        num_attention_heads=16,
        seq_length=2048,
        vocab_size=50272,
    ),
    "gpt_neo_2_7": GPTConfig(
        name="gpt_neo_2_7",
        num_layers=32,
        hidden_size=2560,
        num_attention_heads=32,
        seq_length=2048,
        vocab_size=50257,
    ),
    # Small GPT for the quality benchmark on CPU: the character-level corpus
    # (system/runtime/corpus.py, 63 symbols) fits its 64-token vocabulary; 0.8M parameters.
    "small": GPTConfig(
        name="small",
        num_layers=4,
        hidden_size=128,
        num_attention_heads=4,
        seq_length=128,
        vocab_size=64,
    ),
    # Tiny model for tests and CPU runs (a 50k vocabulary makes a CPU step ~7x slower).
    "debug": GPTConfig(
        name="debug",
        num_layers=4,
        hidden_size=64,
        num_attention_heads=4,
        seq_length=32,
        vocab_size=512,
    ),
}


def get_model(name: str, num_layers: int | None = None) -> GPTConfig:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    m = MODELS[name]
    return m.with_layers(num_layers) if num_layers is not None else m


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """A training workload: model, batch accounting and precision.

    ``global_batch_size`` sequences per iteration are split into ``dp`` macro-batches (one per
    pipeline replica), each cut into micro-batches of ``micro_batch_size`` sequences.
    """

    model: GPTConfig
    global_batch_size: int = 1024  # sequences per iteration
    micro_batch_size: int = 1  # sequences per micro-batch (the authors' runs: 1)
    activation_bytes: int = 2  # fp16 activations on the wire
    gradient_bytes: int = 2  # fp16 gradients on the wire (the authors' constant used fp32: 4)

    def __post_init__(self) -> None:
        if self.global_batch_size < 1 or self.micro_batch_size < 1:
            raise ValueError("workload: global_batch_size and micro_batch_size must be >= 1")
        if self.activation_bytes not in (1, 2, 4) or self.gradient_bytes not in (1, 2, 4):
            raise ValueError("workload: bytes per element must be 1, 2 or 4")

    def check_layout(self, pp: int, dp: int) -> None:
        """Raise ValueError unless ``pp`` stages and ``dp`` replicas divide this workload."""
        if pp < 1 or dp < 1:
            raise ValueError(f"layout pp={pp}, dp={dp}: both must be >= 1")
        if self.model.num_layers % pp:
            raise ValueError(
                f"num_layers={self.model.num_layers} is not divisible into pp={pp} stages"
            )
        if self.global_batch_size % (dp * self.micro_batch_size):
            raise ValueError(
                f"global_batch_size={self.global_batch_size} is not divisible by "
                f"dp={dp} x micro_batch_size={self.micro_batch_size}"
            )

    def micro_batches(self, dp: int) -> int:
        """Micro-batches per replica per iteration."""
        return self.global_batch_size // (dp * self.micro_batch_size)

    @property
    def tokens_per_iteration(self) -> int:
        return self.global_batch_size * self.model.seq_length

    def model_flops(self, recompute: bool = True) -> float:
        """FLOPs of one iteration, Megatron's formula (Narayanan et al., SC'21, Eq. 3).

        With full activation recomputation: 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)); without:
        72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)). Every system in this project reports PFLOPS with
        the ``recompute=True`` count (the paper's runtime checkpoints activations), so the
        numbers compare like for like.
        """
        m = self.model
        b, s, l = self.global_batch_size, m.seq_length, m.num_layers
        h, v = m.hidden_size, m.vocab_size
        if recompute:
            return 96.0 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
        return 72.0 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))


@dataclass(frozen=True, slots=True)
class TaskletSizes:
    """Bytes the cost model charges: c_dp per stage gradient, c_pp per macro-batch boundary."""

    c_dp_bytes: float  # one stage's gradients (all replicas hold this many)
    c_pp_bytes: float  # one macro-batch's activations at one stage boundary
    name: str = "derived"


def tasklet_sizes(workload: Workload, pp: int, dp: int) -> TaskletSizes:
    """Derive c_dp and c_pp (paper §2) for ``pp`` stages and ``dp`` replicas.

    c_dp = params per stage × gradient bytes (the embedding is charged to no stage; it is small
    next to 24+ layers of 12h² and the paper's constant ignores it too).
    c_pp = sequences per macro-batch × seq_length × hidden_size × activation bytes.
    """
    workload.check_layout(pp, dp)
    m = workload.model
    params_per_stage = m.params_per_layer * m.num_layers // pp
    seqs_per_macro = workload.global_batch_size // dp
    return TaskletSizes(
        c_dp_bytes=float(params_per_stage * workload.gradient_bytes),
        c_pp_bytes=float(seqs_per_macro * m.seq_length * m.hidden_size * workload.activation_bytes),
    )


def stage_gradient_params(
    model: GPTConfig, pp: int, *, tied: bool = False, layers: Sequence[int] | None = None
) -> list[float]:
    """Parameters whose gradients each of ``pp`` equal stages synchronises over data parallel.

    Every stage holds ``num_layers / pp`` layers (or ``layers[s]``, an uneven split summing to
    ``num_layers``); the first also the token and position
    embeddings, (V + s)·h; the last also the output head, V·h, and the final LayerNorm, 2h. With
    ``tied`` output weights (Megatron-LM's default) the last stage's head is a copy of the word
    embedding (one matrix when pp = 1); untied (our runtime, :mod:`system.runtime.model`) it is a
    matrix of its own. :func:`tasklet_sizes` leaves these out (the paper's c_dp constant does);
    the simulators charge them.
    """
    h, v = model.hidden_size, model.vocab_size
    if layers is not None:
        if len(layers) != pp or sum(layers) != model.num_layers or min(layers) < 1:
            raise ValueError(
                f"layers={list(layers)}: need {pp} stages summing to {model.num_layers}"
            )
        out = [float(k * model.params_per_layer) for k in layers]
    elif pp < 1 or model.num_layers % pp:
        raise ValueError(f"num_layers={model.num_layers} is not divisible into pp={pp} stages")
    else:
        out = [float(model.num_layers // pp * model.params_per_layer)] * pp
    out[0] += model.embedding_params
    out[-1] += 2.0 * h + (0.0 if tied and pp == 1 else float(v * h))
    return out


# The authors' hard-coded constants (DT-FM scheduler), taken numerically as their code does:
# c_dp = 1.3e9 params × 4 B × 3/24 = 0.65e9 B; c_pp by their formula 2024·2048·2·(1.25e5/2048)
# / 2^30 "GB" = 0.4712492e9 B (a "2024×2048" typo for 2048 sequence positions; 0.47116e9 is a
# rounding of it).
DTFM_C_PP_BYTES = 2024 * 2048 * 2 * (1.25e5 / 2048) / 2**30 * 1e9
DTFM_REFERENCE = TaskletSizes(c_dp_bytes=0.65e9, c_pp_bytes=DTFM_C_PP_BYTES, name="dtfm_reference")

# Named workloads for the scheduler CLI: "dtfm_reference" is the constant preset above (pp=dp=8
# on 64 devices); the others derive sizes from the model and batch.
WORKLOADS: dict[str, Workload | TaskletSizes] = {
    "dtfm_reference": DTFM_REFERENCE,
    "gpt3_xl_b1024": Workload(model=MODELS["gpt3_xl"], global_batch_size=1024),
    "gpt3_xl_l40_b4096": Workload(model=MODELS["gpt3_xl"].with_layers(40), global_batch_size=4096),
    "debug": Workload(model=MODELS["debug"], global_batch_size=16),
}


def get_workload(name: str) -> Workload | TaskletSizes:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    return WORKLOADS[name]
