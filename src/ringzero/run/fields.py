"""The error a field of a run's configuration raises: one line naming the field and what it can take."""

from __future__ import annotations


class FieldError(ValueError):
    """A field of `TrainConfig` holds a value it cannot take; `.field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
