"""One twin: a number the planner predicts beside the run's measurement of it, and their error."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Twin:
    name: str
    predicted: float
    measured: float | None
    """None where the run cannot measure it (the backend's own collectives are opaque to the meter)."""
    unit: str

    @property
    def error(self) -> float | None:
        if not self.predicted or self.measured is None:
            return None
        return (self.measured - self.predicted) / self.predicted

    def to_json(self) -> dict:
        return {"predicted": self.predicted, "measured": self.measured, "unit": self.unit, "error": self.error}
