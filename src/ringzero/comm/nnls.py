"""Non-negative least squares, exactly, for the few columns of the α-β-γ fit (`comm.cost`)."""

from __future__ import annotations

import itertools

import numpy as np


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a x - b|| subject to x >= 0, exactly, by trying every support set.

    With a handful of columns (8 here) that is 255 small least-squares solves: simpler than
    Lawson-Hanson and exact. Columns are scaled to unit norm first (bytes and rounds differ by
    ~10^6). Among supports with the same residual the smaller one wins, so collinear features
    (rounds are constant at one world size) do not get arbitrary splits.
    """
    cols = a.shape[1]
    norms = np.linalg.norm(a, axis=0)
    scale = np.where(norms > 0, norms, 1.0)
    a_s = a / scale
    best_x, best_res = np.zeros(cols), float(np.dot(b, b))
    for k in range(1, cols + 1):
        for support in itertools.combinations(range(cols), k):
            idx = list(support)
            sol = np.linalg.lstsq(a_s[:, idx], b, rcond=None)[0]
            if np.any(sol < 0):
                continue
            r = b - a_s[:, idx] @ sol
            res = float(np.dot(r, r))
            if res < best_res * (1 - 1e-9) - 1e-300:
                best_x, best_res = np.zeros(cols), res
                best_x[idx] = sol
    return best_x / scale
