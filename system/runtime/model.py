"""A plain GPT (nanoGPT-style) that knows nothing about distribution; stages are slices of it.

The model is three kinds of parts, each an ``nn.Module``:

* :class:`Embedding` — tokens (batch, seq) int64 -> hidden (batch, seq, hidden): token + learned
  position embeddings;
* :class:`Block` — pre-LN transformer layer, causal self-attention + GELU MLP, ``x -> x`` with x of
  shape (batch, seq, hidden);
* :class:`Head` — final LayerNorm + LM head, hidden -> logits (batch, seq, vocab).

A pipeline stage (paper §3.5: "stages are slices of consecutive layers") is built by
:func:`build_stage`: stage ``s`` of ``pp`` holds layers ``s·L/pp … (s+1)·L/pp − 1``, the first
stage also the embedding, the last also the head. Every part is initialised from its own
generator seeded by ``(seed, part index)``, so a stage's weights equal the same slice of the full
model for the same seed — pp=1 and pp=4 start from identical weights:

    >>> from system.workload import MODELS
    >>> full = build_stage(MODELS["debug"], pp=1, stage=0, seed=0)
    >>> last = build_stage(MODELS["debug"], pp=2, stage=1, seed=0)
    >>> bool(torch.equal(full.blocks[3].mlp_out.weight, last.blocks[1].mlp_out.weight))
    True

:func:`layer_list` gives ``[Embedding, Block, …, Block, Head]`` for wrappers that take a flat
list of layers (DeepSpeed ``PipelineModule``). Output embeddings are untied by default: tying them
across the first and last pipeline stage would need an extra gradient exchange, which we do not
implement (``tie_embeddings=True`` is refused for pp > 1).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from system.workload import GPTConfig

__all__ = [
    "Embedding",
    "Block",
    "Head",
    "Stage",
    "GPT",
    "build_stage",
    "build_model",
    "layer_list",
    "stage_layers",
    "lm_loss",
]

_INIT_STD = 0.02


def _generator(seed: int, part: int) -> torch.Generator:
    """An independent CPU generator per (seed, part): 0 = embedding, 1+i = block i, -1 = head."""
    g = torch.Generator(device="cpu")
    g.manual_seed((int(seed) * 1_000_003 + (part + 2) * 7919) % (2**63 - 1))
    return g


def _init_linear(lin: nn.Linear, g: torch.Generator, std: float) -> None:
    with torch.no_grad():
        lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) * std)
        if lin.bias is not None:
            lin.bias.zero_()


class Embedding(nn.Module):
    """Token + position embedding: (batch, seq) int64 -> (batch, seq, hidden)."""

    def __init__(self, cfg: GPTConfig, seed: int = 0) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.wpe = nn.Embedding(cfg.seq_length, cfg.hidden_size)
        g = _generator(seed, 0)
        with torch.no_grad():
            self.wte.weight.copy_(torch.randn(self.wte.weight.shape, generator=g) * _INIT_STD)
            self.wpe.weight.copy_(torch.randn(self.wpe.weight.shape, generator=g) * _INIT_STD)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dtype != torch.long:
            raise ValueError(f"Embedding: tokens must be int64, got {tokens.dtype}")
        seq = tokens.shape[1]
        pos = torch.arange(seq, device=tokens.device)
        return self.wte(tokens) + self.wpe(pos)[None]


class Block(nn.Module):
    """Pre-LN transformer layer: x + attn(ln(x)), then x + mlp(ln(x)); shape-preserving."""

    def __init__(self, cfg: GPTConfig, layer: int, seed: int = 0) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.n_head = cfg.num_attention_heads
        self.ln_1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.attn_out = nn.Linear(h, h)
        self.ln_2 = nn.LayerNorm(h)
        self.mlp_in = nn.Linear(h, cfg.ffn_mult * h)
        self.mlp_out = nn.Linear(cfg.ffn_mult * h, h)
        g = _generator(seed, 1 + layer)
        # GPT-2: residual projections scaled by 1/sqrt(2·num_layers)
        resid_std = _INIT_STD / math.sqrt(2 * cfg.num_layers)
        _init_linear(self.qkv, g, _INIT_STD)
        _init_linear(self.attn_out, g, resid_std)
        _init_linear(self.mlp_in, g, _INIT_STD)
        _init_linear(self.mlp_out, g, resid_std)

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).split(h, dim=2)
        # (b, s, h) -> (b, heads, s, h/heads)
        q, k, v = (t.view(b, s, self.n_head, h // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.attn_out(y.transpose(1, 2).reshape(b, s, h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._attention(self.ln_1(x))
        return x + self.mlp_out(F.gelu(self.mlp_in(self.ln_2(x)), approximate="tanh"))


class Head(nn.Module):
    """Final LayerNorm + LM head: (batch, seq, hidden) -> logits (batch, seq, vocab)."""

    def __init__(self, cfg: GPTConfig, seed: int = 0) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        _init_linear(self.lm_head, _generator(seed, -1), _INIT_STD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))


class Stage(nn.Module):
    """Consecutive layers of the GPT: optional embedding, a ``ModuleList`` of blocks, optional head.

    ``forward`` takes tokens if the stage has the embedding, hidden states otherwise, and returns
    logits if it has the head, hidden states otherwise. ``checkpoint=True`` recomputes each block's
    activations in backward (paper §3.5, activation checkpointing per block).
    """

    def __init__(
        self, embed: Embedding | None, blocks: list[Block], head: Head | None, first_layer: int = 0
    ) -> None:
        super().__init__()
        self.embed = embed
        self.blocks = nn.ModuleList(blocks)
        self.head = head
        self.first_layer = first_layer
        self.checkpoint = False

    @property
    def is_first(self) -> bool:
        return self.embed is not None

    @property
    def is_last(self) -> bool:
        return self.head is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks:
            if self.checkpoint and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        if self.head is not None:
            x = self.head(x)
        return x


GPT = Stage  # the full model is the single stage of pp=1


def stage_layers(num_layers: int, pp: int, stage: int) -> range:
    """Layer indices of ``stage`` when ``num_layers`` are cut into ``pp`` equal stages.

    >>> list(stage_layers(8, 4, 2))
    [4, 5]
    """
    if pp < 1 or not 0 <= stage < pp:
        raise ValueError(f"stage {stage} is not in 0..pp-1 for pp={pp}")
    if num_layers % pp:
        raise ValueError(f"num_layers={num_layers} is not divisible into pp={pp} stages")
    per = num_layers // pp
    return range(stage * per, (stage + 1) * per)


def build_stage(
    cfg: GPTConfig, pp: int, stage: int, seed: int = 0, *, tie_embeddings: bool = False
) -> Stage:
    """Stage ``stage`` of ``pp`` of the GPT ``cfg``, initialised exactly as the full model."""
    layers = stage_layers(cfg.num_layers, pp, stage)
    if tie_embeddings and pp > 1:
        raise ValueError("tie_embeddings=True needs pp=1 (no cross-stage embedding gradient sync)")
    embed = Embedding(cfg, seed) if stage == 0 else None
    head = Head(cfg, seed) if stage == pp - 1 else None
    if tie_embeddings:
        head.lm_head.weight = embed.wte.weight
    return Stage(embed, [Block(cfg, i, seed) for i in layers], head, first_layer=layers.start)


def build_model(cfg: GPTConfig, seed: int = 0, *, tie_embeddings: bool = False) -> Stage:
    """The whole GPT as one stage."""
    return build_stage(cfg, 1, 0, seed, tie_embeddings=tie_embeddings)


def layer_list(cfg: GPTConfig, seed: int = 0) -> list[nn.Module]:
    """``[Embedding, Block 0, …, Block L-1, Head]``, the same weights as :func:`build_model`."""
    return [
        Embedding(cfg, seed),
        *(Block(cfg, i, seed) for i in range(cfg.num_layers)),
        Head(cfg, seed),
    ]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy; logits (b, s, V) float, targets (b, s) int64."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
