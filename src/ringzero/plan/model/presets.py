"""Model presets: published architectures, with the tokens they were trained on and the parts of
their training recipe that change a plan.

Shapes are the released configurations (Hugging Face config.json of each checkpoint; GPT-3 from
Brown et al. 2020, Table 2.1). `param_count` reproduces the published parameter counts exactly;
tests pin them.

A `Recipe` carries only what moves the plan's memory or time. Dropout does: its masks, and the
dropped attention weights, are saved for backward (Korthikanti et al. 2022 §4.1), so a LLaMA
planned with dropout it never had is planned too large. Precision does not need a field: fp16 and
bf16 take the same bytes, and the presets' batch sizes are the user's choice.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringzero.plan.model.shapes import ModelShape

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



@dataclass(frozen=True, kw_only=True)
class Recipe:
    """How a preset was trained, as far as it changes the plan (each field is the `Training` field
    of the same name, the default of `ringzero plan --model NAME` unless a flag says otherwise)."""

    dropout: bool
    """Dropout in attention and after each block."""


RECIPES: dict[str, Recipe] = {
    # ringzero's engine trains without dropout unless told (`TrainConfig.dropout` = 0).
    "nano": Recipe(dropout=False), "micro": Recipe(dropout=False),
    # GPT-2: attention, residual and embedding dropout 0.1 (its released config.json).
    "gpt2": Recipe(dropout=True), "gpt2-medium": Recipe(dropout=True), "gpt2-large": Recipe(dropout=True),
    "gpt2-xl": Recipe(dropout=True),
    # GPT-3: Brown et al. 2020 follow GPT-2; Korthikanti et al. 2022 §4.1 count its dropout masks.
    "gpt3-175b": Recipe(dropout=True),
    # LLaMA: no dropout (Touvron et al. 2023; attention_dropout 0.0 and no hidden dropout in the
    # released configs of Llama 2 and Llama 3).
    "llama-2-7b": Recipe(dropout=False), "llama-2-13b": Recipe(dropout=False),
    "llama-2-70b": Recipe(dropout=False), "llama-3-8b": Recipe(dropout=False),
    "llama-3-70b": Recipe(dropout=False),
}
"""Each preset's `Recipe`."""

ALIASES = {"gpt2-124m": "gpt2", "gpt2-350m": "gpt2-medium", "gpt2-774m": "gpt2-large",
           "gpt2-1.5b": "gpt2-xl", "gpt3": "gpt3-175b"}


def model(name: str) -> ModelShape:
    """The preset called `name` (case-insensitive; gpt2-124m etc. are aliases)."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in MODELS:
        raise ValueError(f"unknown model {name!r}; allowed: {', '.join(list(MODELS) + list(ALIASES))}")
    return MODELS[key]


def recipe(name: str) -> Recipe:
    """The training recipe of the preset called `name` (as `model`: case-insensitive, aliases)."""
    return RECIPES[model(name).name]
