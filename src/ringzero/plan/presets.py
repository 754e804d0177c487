"""Model presets: published architectures, with the tokens they were trained on.

Shapes are the released configurations (Hugging Face config.json of each checkpoint; GPT-3 from
Brown et al. 2020, Table 2.1). `param_count` reproduces the published parameter counts exactly;
tests pin them.
"""

from __future__ import annotations

from .shapes import ModelShape

_GPT2 = dict(vocab=50257, seq=1024)
_LLAMA = dict(gated=True, bias=False, tied=False, positions="rotary", norm="rmsnorm")

MODELS: dict[str, ModelShape] = {
    # ringzero's own GPTs (ringzero.train): byte-level vocabulary, small enough for a CPU.
    "nano": ModelShape(name="nano", layers=4, hidden=128, heads=4, vocab=256, seq=256),
    "micro": ModelShape(name="micro", layers=6, hidden=256, heads=8, vocab=256, seq=256),
    # GPT-2 (Radford et al. 2019): 124M, 355M, 774M, 1.5B.
    "gpt2": ModelShape(name="gpt2", layers=12, hidden=768, heads=12, **_GPT2),
    "gpt2-medium": ModelShape(name="gpt2-medium", layers=24, hidden=1024, heads=16, **_GPT2),
    "gpt2-large": ModelShape(name="gpt2-large", layers=36, hidden=1280, heads=20, **_GPT2),
    "gpt2-xl": ModelShape(name="gpt2-xl", layers=48, hidden=1600, heads=25, **_GPT2),
    # GPT-3 175B (Brown et al. 2020): 96 layers, d_model 12288, 96 heads, context 2048.
    "gpt3-175b": ModelShape(name="gpt3-175b", layers=96, hidden=12288, heads=96, vocab=50257, seq=2048),
    # LLaMA 2 (Touvron et al. 2023): 4k context; 70B uses grouped-query attention with 8 KV heads.
    "llama-2-7b": ModelShape(name="llama-2-7b", layers=32, hidden=4096, heads=32, vocab=32000,
                             seq=4096, ffn=11008, **_LLAMA),
    "llama-2-13b": ModelShape(name="llama-2-13b", layers=40, hidden=5120, heads=40, vocab=32000,
                              seq=4096, ffn=13824, **_LLAMA),
    "llama-2-70b": ModelShape(name="llama-2-70b", layers=80, hidden=8192, heads=64, kv_heads=8,
                              vocab=32000, seq=4096, ffn=28672, **_LLAMA),
    # Llama 3 (Meta 2024): 128k vocabulary, 8k context, GQA with 8 KV heads.
    "llama-3-8b": ModelShape(name="llama-3-8b", layers=32, hidden=4096, heads=32, kv_heads=8,
                             vocab=128256, seq=8192, ffn=14336, **_LLAMA),
    "llama-3-70b": ModelShape(name="llama-3-70b", layers=80, hidden=8192, heads=64, kv_heads=8,
                              vocab=128256, seq=8192, ffn=28672, **_LLAMA),
}

TRAINED_TOKENS: dict[str, float] = {
    "gpt3-175b": 300e9,      # Brown et al. 2020, §2.2
    "llama-2-7b": 2e12, "llama-2-13b": 2e12, "llama-2-70b": 2e12,   # Touvron et al. 2023, Table 1
    "llama-3-8b": 15e12, "llama-3-70b": 15e12,                       # Meta, Llama 3 model card
}
"""Tokens the preset was trained on (the default D of `ringzero plan --model NAME`)."""

ALIASES = {"gpt2-124m": "gpt2", "gpt2-350m": "gpt2-medium", "gpt2-774m": "gpt2-large",
           "gpt2-1.5b": "gpt2-xl", "gpt3": "gpt3-175b"}


def model(name: str) -> ModelShape:
    """The preset called `name` (case-insensitive; gpt2-124m etc. are aliases)."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in MODELS:
        raise ValueError(f"unknown model {name!r}; allowed: {', '.join(list(MODELS) + list(ALIASES))}")
    return MODELS[key]
