"""Gradient compression on the data-parallel reduction (`plan.strategies.compression`): the scheme,
PowerSGD's rank, top-k's fraction, and the step it starts at.

`check` refuses, as `TrainConfig` is built, what the run's strategy cannot take (one line naming
the field and what it allows); `compression` and `start` turn the fields into what the engine runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ringzero.plan.strategies.compression import SCHEMES, Compression, max_rank, refusal
from ringzero.run.fields import FieldError, check as check_field, choice

DEFAULT_RANK, DEFAULT_FRACTION, DEFAULT_START_SHARE = 4, 0.01, 0.1


@dataclass(frozen=True, kw_only=True)
class CompressConfig:
    compress: str = "none"
    """Gradient compression: none, fp16, bf16, powersgd or topk (`plan.strategies.compression`)."""
    powersgd_rank: int | None = None
    """PowerSGD's rank R (None: 4)."""
    compress_start: int | None = None
    """The first compressed step; plain all-reduce before it, as PowerSGD's start_powerSGD_iter
    (None: 10 % of the steps)."""
    topk_fraction: float | None = None
    """top-k's share of each bucket's elements a rank sends (None: 0.01)."""

    def __post_init__(self) -> None:
        choice(self, "compress", SCHEMES)
        check_field(self, "powersgd_rank", lambda v: v >= 1, "must be an integer >= 1", integer=True, optional=True)
        check_field(self, "compress_start", lambda v: v >= 0, "must be a step >= 0", integer=True, optional=True)
        check_field(self, "topk_fraction", lambda v: math.isfinite(v) and 0 < v <= 1, "must be in (0, 1]",
                    optional=True)
        for name, scheme in (("powersgd_rank", "powersgd"), ("topk_fraction", "topk")):
            if getattr(self, name) is not None and self.compress != scheme:
                raise FieldError(name, f"{name} is {scheme}'s option: it needs compress={scheme}, not {self.compress!r}")
        if self.compress_start is not None and self.compress == "none":
            raise FieldError("compress_start", f"compress_start says when compression starts: it needs compress "
                                               f"({', '.join(s for s in SCHEMES if s != 'none')})")


def compression(cfg) -> Compression:
    """The run's scheme with its parameters (defaults filled in)."""
    c = cfg.compress
    return Compression(c.compress, c.powersgd_rank or DEFAULT_RANK, c.topk_fraction or DEFAULT_FRACTION)


def start(cfg) -> int:
    """The first compressed step."""
    c = cfg.compress
    return c.compress_start if c.compress_start is not None else int(DEFAULT_START_SHARE * cfg.training.steps)


def no_op_cast(cfg) -> str | None:
    """What an fp16 / bf16 cast does to gradients that are already 16-bit (--precision bf16 or fp16
    keeps them in that type): "same" when they are already of the cast's type (a no-op), "width"
    when of the other 16-bit type (as many bytes, rounded), None when the cast halves them (fp32)
    or the scheme is not a cast."""
    scheme, precision = cfg.compress.compress, cfg.optim.precision
    if scheme not in ("fp16", "bf16") or precision not in ("fp16", "bf16"):
        return None
    return "same" if scheme == precision else "width"


def gpt_matrices(shape) -> list[tuple[int, int]]:
    """ringzero's GPT's weight matrices as PowerSGD views them (rows, cols): the token and position
    tables, and per block qkv, the attention projection and the MLP's two (unsplit by tp)."""
    h, f = shape.hidden, shape.ffn_dim
    return [(shape.vocab, h), (shape.seq, h), (3 * h, h), (h, h), (f, h), (h, f)]


def check(cfg) -> None:
    """Raise a `FieldError` for the first compression option the run cannot take."""
    c, strategy = cfg.compress, cfg.parallel.strategy
    if c.compress == "none":
        return
    why = refusal(c.compress, strategy)
    if why:
        raise FieldError("compress", f"compress={c.compress} {why}")
    grid = cfg.parallel
    if c.compress == "topk" and grid.tp > 1:
        raise FieldError("compress", f"compress=topk with tp={grid.tp}: a bucket mixes each tp rank's own shards with "
                                     f"weights every tp rank holds alike (LayerNorm, row-parallel biases), which top-k "
                                     f"would select differently on each; use powersgd, fp16 or bf16, or tp 1")
    if c.compress == "powersgd":
        most = max_rank(gpt_matrices(cfg.shape))
        if compression(cfg).rank > most:
            raise FieldError("powersgd_rank", f"powersgd_rank={c.powersgd_rank} compresses no matrix of model "
                                              f"{cfg.model.name!r} (an n x m matrix compresses when (n + m)·R·2 < n·m); "
                                              f"allowed 1..{most}")
    at = start(cfg)
    if at >= cfg.training.steps:
        raise FieldError("compress_start", f"compress_start={at} is beyond the {cfg.training.steps} steps; allowed "
                                           f"0..{cfg.training.steps - 1}")
