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


ATTENTIONS = ("eager", "sdpa")
"""eager materialises the s x s scores; sdpa is torch's scaled_dot_product_attention."""


def parameter_shapes(m: ModelShape) -> dict[str, tuple[int, ...]]:
    """Every parameter of ringzero's GPT of shape `m`, by its name in `named_parameters()`, with its
    shape: what a weights file for it must hold (`train.model.GPT` builds exactly these)."""
    h, f = m.hidden, m.ffn_dim
    linear = {"attn.qkv": (3 * h, h), "attn.proj": (h, h), "mlp.fc": (f, h), "mlp.proj": (h, f)}
    out: dict[str, tuple[int, ...]] = {"wte.weight": (m.vocab, h), "wpe.weight": (m.seq, h)}
    for i in range(m.layers):
        for part in ("ln1", "attn.qkv", "attn.proj", "ln2", "mlp.fc", "mlp.proj"):
            name = f"blocks.{i}.{part}"
            out[f"{name}.weight"] = linear.get(part, (h,))
            if m.bias:
                out[f"{name}.bias"] = (linear[part][0],) if part in linear else (h,)
    out["ln_f.weight"] = (h,)
    if m.bias:
        out["ln_f.bias"] = (h,)
    return out
