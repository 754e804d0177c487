"""The model a run trains: which of ringzero's GPT presets, at what length and depth, with which
attention (`train.model` builds it)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ringzero.plan.model.presets import MODELS
from ringzero.plan.model.presets import model as preset
from ringzero.plan.model.shapes import ModelShape
from ringzero.run.fields import check, choice
from ringzero.run.gpt_shape import ATTENTIONS, check_shape, trainable

TRAINABLE = tuple(name for name, shape in MODELS.items() if trainable(shape))
"""The presets ringzero's GPT can take (`gpt_shape.check_shape`)."""


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    name: str = "nano"
    """Model preset: ringzero's own GPTs nano and micro, or gpt2 and larger (slow on a CPU)."""
    seq: int | None = None
    """Sequence length in tokens, which are bytes (None: the preset's)."""
    layers: int | None = None
    """Transformer blocks of the model (None: the preset's)."""
    attention: str = "eager"
    """"eager" (materialises the s x s scores) or "sdpa" (torch's fused attention)."""
    dropout: float = 0.0
    """Probability of zeroing an activation in training, in [0, 1) (0: no dropout op at all)."""

    def __post_init__(self) -> None:
        choice(self, "name", TRAINABLE, field="model")
        choice(self, "attention", ATTENTIONS)
        for name in ("seq", "layers"):
            check(self, name, lambda v: v >= 1, "must be >= 1", integer=True, optional=True)
        check(self, "dropout", lambda v: 0 <= v < 1, "must be in [0, 1)")
        check_shape(self.shape)

    @property
    def shape(self) -> ModelShape:
        m = preset(self.name)
        changes = {k: v for k, v in (("seq", self.seq), ("layers", self.layers)) if v is not None}
        return dataclasses.replace(m, **changes) if changes else m
