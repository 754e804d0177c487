"""algorithm="auto": the algorithm with the least predicted time under the α-β-γ model.

For a call of `nbytes` on `n` ranks, every algorithm of the collective is priced with
`plan.comm.network.predict` (the slowest rank's rounds, messages, bytes and bytes reduced, from the
exact traffic formulas) using the calibration of this machine and transport (`comm.cost`, fitted
by `ringzero bench comm --calibrate`, times its measured correction at that size,
`comm.correction`), or the transport's `plan.comm.network.DEFAULTS` when there is none; the cheapest
wins, ties going to the first in `plan.comm.algorithms` order. A calibration also prices the ring's
pipeline: the bytes it moves behind earlier segments, off its critical path, at their own fitted
coefficients (`plan.comm.volume.overlapped_bytes`, `cost.overlap_credit`). This is how MPICH picks between its
algorithms (Thakur, Rabenseifner & Gropp 2005), with measured instead of hand-set thresholds, and
it reproduces the usual rule of thumb: ring for few ranks and large tensors, Rabenseifner or trees
when messages are small and α dominates.

Every algorithm of the collective is a candidate, the node-aware ones (`hierarchical`,
`hierarchical_2d`) only when the group spans more than one node (ranks_per_node < n; whole nodes for
hierarchical_2d). The choice is a pure function of its arguments and the
calibration file, so every rank of a group picks the same algorithm as long as they read the same
file (on a cluster: the same calibration on every node).

`nbytes` is the whole buffer, in the convention of `plan.comm.volume.call_for`: the tensor of
all-reduce, reduce and broadcast; the n-chunk output of all-gather and gather; the n-chunk input
of reduce-scatter and scatter; one rank's whole input of all-to-all.
"""

from __future__ import annotations

import functools
import os

from ringzero.plan.comm.algorithms import spans_nodes_ok
from ringzero.plan.comm.chunks import chunk_sizes
from ringzero.plan.comm.volume import PIPELINED, Call, formula, volumes
from ringzero.plan.comm.network import DEFAULTS, predict
from ringzero.comm import correction, cost, registry
from ringzero.comm.calibration_io import check_made_here

_cache: dict = {}
"""Per transport: the calibration file's identity (path, mtime, size) and what it held."""


def candidates(collective: str, n: int, ranks_per_node: int | None) -> tuple[str, ...]:
    """The algorithms `choose` weighs for this call."""
    if collective not in registry.TABLE:
        registry.check_name(collective, "auto")  # raises, naming the valid collectives
    return tuple(a for a in registry.algorithms(collective) if spans_nodes_ok(a, n, ranks_per_node))


def calibration(transport: str = "gloo"):
    """The calibration in effect for `transport` (None without one), re-read only when its file
    changes; a file made with another transport or on another host is refused (ValueError)."""
    path = cost.calibration_file(transport=transport)
    try:
        st = os.stat(path)
        key = (path, st.st_mtime_ns, st.st_size)
    except OSError:
        key = (path, None, None)
    entry = _cache.setdefault(transport, {"key": None, "cal": None})
    if entry["key"] != key:
        cal = cost.load(path, transport) if key[1] is not None else None
        if cal is not None:
            check_made_here(cal, path, transport)
        entry["cal"], entry["key"] = cal, key
    return entry["cal"]


def _call(collective: str, algorithm: str, n: int, nbytes: int, ranks_per_node: int | None) -> Call:
    """The call priced for `nbytes`, counted in bytes (itemsize 1: the dtype does not matter)."""
    if collective == "all_to_all":
        row = tuple(chunk_sizes(nbytes, n))
        return Call(collective=collective, algorithm=algorithm, n=n, itemsize=1,
                    matrix=tuple(row for _ in range(n)))
    return Call(collective=collective, algorithm=algorithm, n=n, sizes=tuple(chunk_sizes(nbytes, n)),
                itemsize=1, ranks_per_node=ranks_per_node)


def _model(collective: str, algorithm: str, cal, transport: str = "gloo"):
    """The coefficients that price `algorithm`: its own in `cal`, else (for "torch") its twin's, else
    the shared model; the transport's `DEFAULTS` without a calibration."""
    if cal is None:
        return DEFAULTS.get(transport, DEFAULTS["gloo"])
    own = cal.per_algorithm.get(f"{collective}/{algorithm}")
    return own if own is not None else cal.model_for(collective, formula(collective, algorithm))


def _price(collective: str, algorithm: str, n: int, nbytes: int, ranks_per_node: int | None, cal,
           transport: str = "gloo") -> float:
    """`network.predict` less the calibrated credit for the bytes a pipelined algorithm moves behind
    earlier segments (`cost.overlap_credit`; none without a calibration), times the calibration's
    measured correction at this size (`comm.correction`). "torch" gets no credit: the backend's own
    collective is not ringzero's pipeline."""
    call = _call(collective, formula(collective, algorithm), n, max(0, nbytes), ranks_per_node)
    model = _model(collective, algorithm, cal, transport)
    seconds = predict(call, model)
    if cal is None or not seconds:
        return seconds
    if (collective, algorithm) in PIPELINED:
        seconds -= cost.overlap_credit(model, cal.overlap_for(collective, algorithm),
                                       cost.overlapped(call, volumes(call)))
    return seconds * correction.factor(cal.correction, collective, algorithm, n, ranks_per_node, nbytes)


def price(collective: str, algorithm: str, n: int, nbytes: int, ranks_per_node: int | None, cal,
          transport: str = "gloo") -> float:
    """Predicted seconds of one named algorithm under calibration `cal` (None: the transport's defaults)."""
    return _price(collective, algorithm, n, nbytes, ranks_per_node, cal, transport)


def _times(collective: str, n: int, nbytes: int, ranks_per_node: int | None, cal, transport: str) -> dict[str, float]:
    return {alg: _price(collective, alg, n, nbytes, ranks_per_node, cal, transport)
            for alg in candidates(collective, n, ranks_per_node)}


def best(collective: str, n: int, nbytes: int, ranks_per_node: int | None, cal, transport: str = "gloo") -> str:
    """The cheapest candidate under calibration `cal` (None: the transport's defaults); ties by table order."""
    names = candidates(collective, n, ranks_per_node)
    if n <= 1 or nbytes <= 0:
        return names[0]
    times = _times(collective, n, nbytes, ranks_per_node, cal, transport)
    return min(names, key=lambda a: (times[a], names.index(a)))


@functools.lru_cache(maxsize=4096)
def _best(collective: str, n: int, nbytes: int, ranks_per_node: int | None, transport: str, cal_key) -> str:
    # cal_key (the file's path, mtime and size) only keys the cache; the loaded file is in _cache.
    return best(collective, n, nbytes, ranks_per_node, _cache[transport]["cal"], transport)


def seconds(collective: str, algorithm: str, n: int, nbytes: int, ranks_per_node: int | None = None,
            transport: str = "gloo") -> float:
    """Predicted seconds of one named algorithm, candidate or not (`hierarchical` on one node runs its
    node-local tree), or "torch", priced as its `comm_volume.BACKEND_TWIN` with the calibration's
    model for "torch" when it has one, else the twin's."""
    if algorithm == "auto":
        algorithm = choose(collective, n, nbytes, ranks_per_node, transport)
    return _price(collective, algorithm, n, nbytes, ranks_per_node, calibration(transport), transport)


def choose(collective: str, n: int, nbytes: int, ranks_per_node: int | None, transport: str = "gloo") -> str:
    """The algorithm `algorithm="auto"` runs for `nbytes` on `n` ranks whose messages take `transport`."""
    calibration(transport)
    return _best(collective, n, nbytes, ranks_per_node, transport, _cache[transport]["key"])
