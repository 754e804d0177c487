"""Settings of `ringzero.comm` that are not per call: one frozen, validated object.

    with comm.configure(ranks_per_node=2, checks=True):
        comm.all_reduce(t, algorithm="hierarchical")
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from dataclasses import dataclass


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "0").lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True, kw_only=True)
class CommConfig:
    ranks_per_node: int | None = None
    """Ranks per node for `hierarchical` (and the two-tier cost model). None: LOCAL_WORLD_SIZE
    under torchrun, else RINGZERO_RANKS_PER_NODE, else the whole group is one node."""

    checks: bool = dataclasses.field(default_factory=lambda: _env_flag("RINGZERO_CHECKS"))
    """Before each collective, all-gather a few integers (collective, algorithm, op, dtype, count,
    root) and raise on every rank if they disagree, instead of hanging. RINGZERO_CHECKS=1 turns it on."""

    calibration: str | None = None
    """Calibration file for algorithm="auto"; None: RINGZERO_CALIBRATION, else the default path."""

    def __post_init__(self) -> None:
        if self.ranks_per_node is not None and self.ranks_per_node < 1:
            raise ValueError(f"ranks_per_node must be >= 1, got {self.ranks_per_node}")

    def node_size(self, group_size: int) -> int:
        """Ranks per node to use in a group of `group_size`."""
        k = self.ranks_per_node
        if k is None:
            env = os.environ.get("RINGZERO_RANKS_PER_NODE") or os.environ.get("LOCAL_WORLD_SIZE")
            k = int(env) if env else group_size
        return max(1, min(k, group_size))


_current = CommConfig()


def get_config() -> CommConfig:
    return _current


def set_config(config: CommConfig) -> CommConfig:
    """Install `config`; returns the previous one."""
    global _current
    prev, _current = _current, config
    return prev


@contextlib.contextmanager
def configure(**changes):
    """Temporarily replace fields of the current config."""
    prev = set_config(dataclasses.replace(_current, **changes))
    try:
        yield _current
    finally:
        set_config(prev)


_thread = threading.local()


def mark_beside_compute() -> None:
    """Declare that collectives issued from this thread run beside computation on other threads.

    A training step's communication thread (`parallel.comm_queue`) calls this once. Algorithms
    then post their receives as early as they can, so that gloo's own I/O thread (C++, no GIL)
    answers each sender and moves the data while this thread waits for the GIL or a core; alone,
    they post each receive just before its wait, which costs less CPU per message (`ring.py`).
    """
    _thread.beside_compute = True


def beside_compute() -> bool:
    """Whether this thread's collectives run beside computation (see `mark_beside_compute`)."""
    return getattr(_thread, "beside_compute", False)
