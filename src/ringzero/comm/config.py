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


_ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _checks_from_env() -> bool:
    """RINGZERO_CHECKS when set, else whether TORCH_DISTRIBUTED_DEBUG is DETAIL."""
    value = os.environ.get("RINGZERO_CHECKS", "").strip().lower()
    if value in _ON or value in _OFF:
        return value in _ON
    if value:
        raise ValueError(f"RINGZERO_CHECKS={os.environ['RINGZERO_CHECKS']!r}: use 1 or 0 "
                         f"(or {'/'.join(_ON[1:])}, {'/'.join(_OFF[1:])})")
    return os.environ.get("TORCH_DISTRIBUTED_DEBUG", "").strip().upper() == "DETAIL"


@dataclass(frozen=True, kw_only=True)
class CommConfig:
    """How `ringzero.comm` runs its collectives. Each field's default comes from the environment
    when the config is built: `checks` follows RINGZERO_CHECKS, or TORCH_DISTRIBUTED_DEBUG=DETAIL as
    torch users expect, and RINGZERO_CHECKS=0 overrides DETAIL."""

    ranks_per_node: int | None = None
    """Ranks per node for `hierarchical` (and the two-tier cost model). None: LOCAL_WORLD_SIZE
    under torchrun, else RINGZERO_RANKS_PER_NODE, else the whole group is one node."""

    checks: bool = dataclasses.field(default_factory=_checks_from_env)
    """Before each collective, all-gather a few integers describing the call (`comm.check`: call
    number on the group, collective, algorithm, op, dtype, count, root, list sizes) and raise the
    same error on every rank if they disagree, instead of hanging or returning garbage. It costs
    one small backend all-gather per collective. Default: RINGZERO_CHECKS (1/0, true/false,
    yes/no, on/off) when set, else on when TORCH_DISTRIBUTED_DEBUG=DETAIL (torch's switch for its
    own collective consistency checks), else off; RINGZERO_CHECKS=0 turns it off even under DETAIL."""

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
