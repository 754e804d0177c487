"""Transformer shapes and their exact parameter count (the approximation: Kaplan et al. 2020 §2.1).

The usual approximation counts a decoder-only transformer with d_ffn = 4·d_model and
d_head·n_head = d_model (Kaplan et al. 2020, Table 1, keep the 12·d_model² term only):

    N ≈ n_layers · (12·d_model² + 5·d_model)          (`approx_params`)

12h² is the four attention projections (4h²) plus the two MLP matrices (8h²); the 5h is the
MLP biases (4h + h) only. `param_count` counts every tensor of the architecture instead:
embeddings, positions, each attention projection (grouped-query K/V of kv_heads·head_dim columns),
the MLP (three matrices when gated, as SwiGLU), biases, norms (LayerNorm has a weight and a bias,
RMSNorm only a weight) and the output head unless it is tied to the embedding. For GPT-2 small it
gives 124,439,808 and for LLaMA-2-7B 6,738,415,616, the counts of the published checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ringzero.plan.units import cached_hash, uncached_state

POSITIONS = ("learned", "rotary")
NORMS = ("layernorm", "rmsnorm")


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """A decoder-only transformer, as the planner (and ringzero's GPT) sees it."""

    name: str = "custom"
    """Preset name, or "custom"."""
    layers: int
    """Transformer blocks L."""
    hidden: int
    """Model width h (d_model)."""
    heads: int
    """Attention heads a; must divide h."""
    kv_heads: int | None = None
    """Key/value heads for grouped-query attention (None: = heads, i.e. multi-head attention)."""
    vocab: int
    """Vocabulary size V."""
    seq: int
    """Sequence length s (also the size of the learned position table)."""
    ffn: int | None = None
    """MLP inner width (None: 4h)."""
    gated: bool = False
    """Gated MLP (SwiGLU: three h x ffn matrices) instead of two."""
    bias: bool = True
    """Biases on the linear layers."""
    tied: bool = True
    """Output head shares the token embedding."""
    positions: str = "learned"
    """"learned" (a seq x h table) or "rotary" (no parameters)."""
    norm: str = "layernorm"
    """"layernorm" (weight and bias) or "rmsnorm" (weight only)."""

    def __post_init__(self) -> None:
        for field in ("layers", "hidden", "heads", "vocab", "seq"):
            if getattr(self, field) < 1:
                raise ValueError(f"model {field} must be >= 1, got {getattr(self, field)}")
        if self.hidden % self.heads:
            raise ValueError(f"model hidden={self.hidden} must be divisible by heads={self.heads}")
        if self.kv_heads is not None and not (1 <= self.kv_heads <= self.heads
                                              and self.heads % self.kv_heads == 0):
            raise ValueError(f"model kv_heads={self.kv_heads} must divide heads={self.heads}")
        if self.ffn is not None and self.ffn < 1:
            raise ValueError(f"model ffn must be >= 1, got {self.ffn}")
        if self.positions not in POSITIONS:
            raise ValueError(f"model positions={self.positions!r}; allowed: {', '.join(POSITIONS)}")
        if self.norm not in NORMS:
            raise ValueError(f"model norm={self.norm!r}; allowed: {', '.join(NORMS)}")

    def __hash__(self) -> int:
        return cached_hash(self)

    def __getstate__(self) -> dict:
        return uncached_state(self)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv(self) -> int:
        """Key/value heads (= heads without GQA)."""
        return self.kv_heads or self.heads

    @property
    def ffn_dim(self) -> int:
        return self.ffn or 4 * self.hidden


@dataclass(frozen=True)
class ParamCount:
    """Parameters by component (elements, not bytes)."""

    embedding: int
    positions: int
    attention: int
    """All layers' Q, K, V and output projections (with biases)."""
    mlp: int
    """All layers' MLP matrices (with biases)."""
    norms: int
    """All layers' two norms plus the final norm."""
    head: int
    """Output projection (0 when tied)."""
    per_layer: int
    """One block: attention + MLP + its two norms (what pipeline stages divide)."""

    @property
    def total(self) -> int:
        return self.embedding + self.positions + self.attention + self.mlp + self.norms + self.head



def attention_params(m: ModelShape) -> int:
    """One block's attention: Q and output (h x h each), K and V (h x kv·head_dim each)."""
    kv_dim = m.kv * m.head_dim
    weights = 2 * m.hidden * m.hidden + 2 * m.hidden * kv_dim
    return weights + (2 * m.hidden + 2 * kv_dim if m.bias else 0)


def mlp_params(m: ModelShape) -> int:
    """One block's MLP: 2 (3 when gated) h x ffn matrices; biases ffn per up matrix and h on down."""
    ups = 2 if m.gated else 1
    return (ups + 1) * m.hidden * m.ffn_dim + ((ups * m.ffn_dim + m.hidden) if m.bias else 0)


def norm_params(m: ModelShape) -> int:
    """One norm: weight (and bias for LayerNorm)."""
    return m.hidden * (2 if m.norm == "layernorm" else 1)


@lru_cache(maxsize=1024)
def param_count(m: ModelShape) -> ParamCount:
    """Exact parameter count of `m`, by component."""
    norm = norm_params(m)
    return ParamCount(
        embedding=m.vocab * m.hidden,
        positions=m.seq * m.hidden if m.positions == "learned" else 0,
        attention=m.layers * attention_params(m),
        mlp=m.layers * mlp_params(m),
        norms=(2 * m.layers + 1) * norm,
        head=0 if m.tied else m.vocab * m.hidden,
        per_layer=attention_params(m) + mlp_params(m) + 2 * norm,
    )


def approx_params(layers: int, hidden: int) -> int:
    """N ≈ L·(12h² + 5h): Kaplan et al. 2020's 12·L·h² + MLP biases (GPT-3 175B: 96 x 12288 -> 1.74e11)."""
    return layers * (12 * hidden * hidden + 5 * hidden)
