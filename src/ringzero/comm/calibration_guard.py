"""The guard on writing a calibration: a fit must predict its own measurements at least as well as
the built-in defaults (`plan.network.AlphaBetaGamma()`), or it is not written (`cost.save`)."""

from __future__ import annotations


TOLERANCE = 1e-6
"""Median errors this close are equal: a fit of measurements the defaults predict exactly recovers
them up to rounding, and is not refused for its last bits."""


class WorseThanDefaults(RuntimeError):
    """A fit that predicts its own measurements worse than the built-in defaults (`save` refuses it)."""


def check_better(cal) -> None:
    """WorseThanDefaults when `cal`'s median fit error exceeds the defaults' on the same rows.

    No file means `auto` prices with `AlphaBetaGamma()`'s defaults; a file replaces them for every
    later call, so one that predicts its own measurements worse (a noisy sweep of a few sizes once
    fitted α = β = γ = 0 at a 57.9 % median error) would only make `auto` pick worse. A fit from an
    older ringzero, without the defaults' error beside it, is not judged."""
    mine, defaults = cal.error.get("median"), cal.error.get("defaults", {}).get("median")
    if mine is not None and defaults is not None and mine > defaults + TOLERANCE:
        raise WorseThanDefaults(
            f"calibration not written: its median fit error, {mine:.1%} over {cal.error.get('rows')} rows, is worse "
            f"than the built-in defaults' {defaults:.1%} on the same measurements, which \"auto\" keeps using; "
            "measure more sizes (--sizes 4KiB,1MiB,16MiB) or iterations (--iters) on a quieter machine")
