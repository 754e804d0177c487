"""Settings of `ringzero.comm` that are not per call: one frozen, validated object.

    with comm.configure(ranks_per_node=2, checks=True):
        comm.all_reduce(t, algorithm="hierarchical")
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import threading
from dataclasses import dataclass


_ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


TRANSPORTS = ("auto", "shm", "gloo")
"""Point-to-point transports (`comm.transport`): auto (shared memory between ranks of one host, the
backend between hosts), shm (shared memory only), gloo (the backend's point-to-point)."""


def _transport_from_env() -> str:
    return os.environ.get("RINGZERO_TRANSPORT", "").strip().lower() or "auto"


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
    """Ranks per node for `hierarchical` (and the two-tier cost model), for the traffic meter's
    cross-node bytes and for the link emulator (`inter_node_gbps`). None: LOCAL_WORLD_SIZE under
    torchrun, else RINGZERO_RANKS_PER_NODE, else the whole group is one node."""

    checks: bool = dataclasses.field(default_factory=_checks_from_env)
    """Before each collective, all-gather a few integers describing the call (`comm.check`: call
    number on the group, collective, algorithm, op, dtype, count, root, list sizes) and raise the
    same error on every rank if they disagree, instead of hanging or returning garbage. It costs
    one small backend all-gather per collective. Default: RINGZERO_CHECKS (1/0, true/false,
    yes/no, on/off) when set, else on when TORCH_DISTRIBUTED_DEBUG=DETAIL (torch's switch for its
    own collective consistency checks), else off; RINGZERO_CHECKS=0 turns it off even under DETAIL."""

    calibration: str | None = None
    """Calibration file for algorithm="auto"; None: RINGZERO_CALIBRATION, else the default path."""

    inter_node_gbps: float | None = None
    """Emulate an inter-node network of this many GB/s (1e9 bytes/s) per rank on one machine: every
    message a collective sends to a rank of another node (nodes are `ranks_per_node` consecutive
    global ranks) is held back by its sender as long as such a link would take to deliver it
    (`comm.link_emulator`); messages inside a node go at the machine's own speed. None: no
    emulation. The backend's own collectives (algorithm "torch") are never delayed."""

    inter_node_latency_us: float = 0.0
    """Latency of each message on the emulated inter-node link, in µs (the α of the α-β model);
    used only with `inter_node_gbps`."""

    transport: str = dataclasses.field(default_factory=_transport_from_env)
    """How ringzero's point-to-point messages travel (`comm.transport`): "auto" (shared memory
    between ranks of one host, the backend's between hosts), "shm" (shared memory; a pair on two
    hosts is an error), "gloo" (the backend's point-to-point everywhere). CUDA tensors under NCCL
    always take NCCL. Default: RINGZERO_TRANSPORT, else auto."""

    arena_max_bytes: int | None = 64 << 20
    """Scratch requests of a collective (`TorchComm.empty`: the algorithms' receive buffers, the
    work copies of reduce, reduce-scatter, gather, scatter and all-to-all) up to this many bytes
    come from a per-thread arena kept across calls, so repeated calls touch the same pages; larger
    ones are plain allocations, so the arena never pins more than about twice this. None: every
    request from the arena, which then holds the largest call's scratch (what `ringzero bench comm`
    runs: one collective at a time, each repeated hundreds of times)."""

    def __post_init__(self) -> None:
        if self.arena_max_bytes is not None and not (_number(self.arena_max_bytes) and self.arena_max_bytes >= 0):
            raise ValueError(f"arena_max_bytes must be bytes >= 0, or None, got {self.arena_max_bytes!r}")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got {self.transport!r}")
        if self.ranks_per_node is not None and self.ranks_per_node < 1:
            raise ValueError(f"ranks_per_node must be >= 1, got {self.ranks_per_node}")
        g = self.inter_node_gbps
        if g is not None and not (_number(g) and g > 0 and math.isfinite(g)):
            raise ValueError(f"inter_node_gbps must be a finite number of GB/s > 0, or None, got {g!r}")
        lat = self.inter_node_latency_us
        if not (_number(lat) and lat >= 0 and math.isfinite(lat)):
            raise ValueError(f"inter_node_latency_us must be a finite number of µs >= 0, got {lat!r}")

    def node_size(self, group_size: int) -> int:
        """Ranks per node to use in a group of `group_size`."""
        k = self.world_node_size()
        return group_size if k is None else max(1, min(k, group_size))

    def world_node_size(self) -> int | None:
        """Ranks per node of the whole world (the field, else RINGZERO_RANKS_PER_NODE, else
        LOCAL_WORLD_SIZE; `node_size` clips it to a group); None when the world is one node. The node
        of global rank g is g // world_node_size(): what the traffic meter and the link emulator
        use to tell inter-node messages from intra-node ones."""
        k = self.ranks_per_node
        if k is None:
            env = os.environ.get("RINGZERO_RANKS_PER_NODE") or os.environ.get("LOCAL_WORLD_SIZE")
            if not env:
                return None
            k = int(env)
        return max(1, k)


def _number(x) -> bool:
    """A real number that is not a bool (True would otherwise pass as 1)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


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
