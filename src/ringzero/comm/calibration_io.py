"""A calibration as data and as a file: its coefficients, corrections and provenance.

File: `path` argument, else `CommConfig.calibration`, else $RINGZERO_CALIBRATION, else the
transport's default, ~/.cache/ringzero/calibration.json for gloo and calibration-shm.json for the
shared-memory transport (`comm.transport`): a calibration prices one transport on one host, and
records both (`meta["transport"]`, `meta["host"]`); `check_made_here` refuses it anywhere else.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

from ringzero.comm import correction as corrections
from ringzero.comm.calibration_guard import check_better
from ringzero.comm.config import get_config
from ringzero.comm.ring_overlap import OVERLAP
from ringzero.plan.comm.network import FEATURES, AlphaBetaGamma

SCHEMA = 1
DEFAULT_PATH = "~/.cache/ringzero/calibration.json"
"""Gloo's default file; another transport's is calibration-<transport>.json beside it."""


def calibration_file(path: str | os.PathLike | None = None, transport: str = "gloo") -> str:
    """Where the calibration lives, as a string (cheap: `select` asks on every "auto" call)."""
    default = DEFAULT_PATH if transport == "gloo" else DEFAULT_PATH.replace(".json", f"-{transport}.json")
    chosen = path or get_config().calibration or os.environ.get("RINGZERO_CALIBRATION") or default
    return os.path.expanduser(os.fspath(chosen))


def calibration_path(path: str | os.PathLike | None = None, transport: str = "gloo") -> Path:
    """Where the calibration lives (see the module docstring for the order of precedence)."""
    return Path(calibration_file(path, transport))


def here() -> str:
    """This host's name, as a calibration records it."""
    return platform.node()


def check_made_here(cal: "Calibration", path, transport: str) -> None:
    """ValueError (one line) when `cal` records another transport or host than this run's."""
    made_t, made_h = cal.meta.get("transport", "gloo"), cal.meta.get("host")
    if made_t != transport or (made_h is not None and made_h != here()):
        raise ValueError(f"calibration file {path} was made with transport {made_t} on host {made_h}; this run "
                         f"uses transport {transport} on host {here()}: calibrate here (ringzero bench comm "
                         f"--calibrate --transport {transport}) or set RINGZERO_CALIBRATION to another file")


@dataclass(frozen=True)
class Calibration:
    """Fitted coefficients and how well they fit."""

    model: AlphaBetaGamma
    """The shared model: one α, β, γ for every algorithm."""
    per_algorithm: dict[str, AlphaBetaGamma] = field(default_factory=dict)
    """"collective/algorithm" -> that algorithm's own coefficients."""
    error: dict = field(default_factory=dict)
    """Relative fit errors: {"median", "max", "rows", "shared": {"median", "max"}, "defaults":
    {"median", "max"}} (the last: `AlphaBetaGamma()`'s on the same rows)."""
    meta: dict = field(default_factory=dict)
    """Where and when it was measured."""
    overlap: dict[str, dict[str, float]] = field(default_factory=dict)
    """"shared" or "collective/algorithm" (the model it belongs to) -> {"beta", "host_beta"}:
    seconds per byte moved behind an earlier segment of a pipeline (`OVERLAP`); absent: none."""
    correction: dict = field(default_factory=dict)
    """The measured / predicted ratios by algorithm, world and size (`comm.correction`)."""

    def model_for(self, collective: str, algorithm: str) -> AlphaBetaGamma:
        return self.per_algorithm.get(f"{collective}/{algorithm}", self.model)

    def overlap_for(self, collective: str, algorithm: str) -> dict[str, float] | None:
        """The overlap coefficients of the model that prices `algorithm` (None: every byte at β)."""
        key = f"{collective}/{algorithm}"
        return self.overlap.get(key if key in self.per_algorithm else "shared")

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "model": self.model.as_dict(),
                "per_algorithm": {k: m.as_dict() for k, m in sorted(self.per_algorithm.items())},
                "overlap": dict(sorted(self.overlap.items())), "correction": self.correction,
                "error": self.error, "meta": self.meta}

    @classmethod
    def from_json(cls, data: dict) -> "Calibration":
        if data.get("schema") != SCHEMA:
            raise ValueError(f"schema {data.get('schema')!r}, expected {SCHEMA}")
        return cls(model=_model(data["model"]),
                   per_algorithm={k: _model(m) for k, m in data.get("per_algorithm", {}).items()},
                   error=data.get("error", {}), meta=data.get("meta", {}),
                   overlap={k: _overlap(v) for k, v in data.get("overlap", {}).items()},
                   correction=corrections.check(data.get("correction", {})))


def _overlap(coefs: dict) -> dict[str, float]:
    if set(coefs) != set(OVERLAP) or not all(isinstance(v, (int, float)) and v >= 0 for v in coefs.values()):
        raise ValueError(f"overlap coefficients must be {' and '.join(OVERLAP)} (>= 0), got {coefs!r}")
    return {k: float(coefs[k]) for k in OVERLAP}


def _model(coefs: dict) -> AlphaBetaGamma:
    """Coefficients from a file: unknown names are an error, missing ones are 0 (not the defaults)."""
    unknown = set(coefs) - set(FEATURES)
    if unknown:
        raise ValueError(f"unknown coefficient(s) {', '.join(sorted(unknown))}")
    return AlphaBetaGamma.from_coefficients([coefs.get(k, 0.0) for k in FEATURES])


def load(path: str | os.PathLike | None = None, transport: str = "gloo") -> Calibration | None:
    """The calibration at `calibration_path(path, transport)`, or None if there is no file."""
    p = calibration_path(path, transport)
    if not p.is_file():
        return None
    try:
        return Calibration.from_json(json.loads(p.read_text()))
    except (ValueError, KeyError, TypeError, RecursionError) as exc:      # RecursionError: nested too deeply
        raise ValueError(f"calibration file {p} is not valid ({exc}); re-run "
                         f"`ringzero bench comm --calibrate` or delete it") from None


def save(cal: Calibration, path: str | os.PathLike | None = None) -> Path:
    """Write `cal` as JSON (atomically: readers never see half a file); return the path. The
    default location's folder is created; a given path's folder must exist (`outputs.check`).
    A fit worse than the defaults is refused, nothing written (`check_better`)."""
    from ringzero.outputs import write_text
    check_better(cal)
    p = calibration_path(path, cal.meta.get("transport", "gloo"))
    if path is None:
        p.parent.mkdir(parents=True, exist_ok=True)
    write_text(p, json.dumps(cal.to_json(), indent=2) + "\n")
    return p
