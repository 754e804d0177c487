"""Which model shapes ringzero's GPT can take (`train.model`): torch-free, so that a config is
checked before torch is imported."""

from __future__ import annotations

from ringzero.plan.model.shapes import ModelShape


def check_shape(m: ModelShape) -> None:
    """ringzero's GPT has learned positions, LayerNorm, an ungated MLP, tied embeddings and MHA."""
    wrong = [f"{k}={getattr(m, k)!r}" for k, ok in (("positions", m.positions == "learned"),
             ("norm", m.norm == "layernorm"), ("gated", not m.gated), ("tied", m.tied),
             ("kv_heads", m.kv == m.heads)) if not ok]
    if wrong:
        raise ValueError(f"ringzero's GPT cannot take {', '.join(wrong)}: it has learned positions, "
                         "LayerNorm, a GELU MLP, tied embeddings and multi-head attention")


def trainable(shape: ModelShape) -> bool:
    try:
        check_shape(shape)
        return True
    except ValueError:
        return False
