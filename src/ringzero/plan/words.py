"""Counted nouns for the planner's sentences: "1 GPU", "8 GPUs" (never "1 GPUs")."""

from __future__ import annotations


def plural(count: int, noun: str, many: str | None = None, spec: str = "") -> str:
    """'1 GPU', '8 GPUs', '1 micro-batch'; `many` for an irregular plural, `spec` formats the count
    (',' for thousands separators)."""
    return f"{count:{spec}} {noun if count == 1 else (many or noun + 's')}"


def gpus(count: int) -> str:
    """'1 GPU', '1024 GPUs' (no separator: the count as --gpus takes it)."""
    return plural(count, "GPU")
