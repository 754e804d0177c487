"""Host memory a local training run needs, checked against what the machine has before ranks start.

Per rank: the process itself (Python, torch and a gloo group: 220 MiB resident measured on the
development machine right after `import torch` and joining the group, as `python -c "import torch,
torch.distributed as d; d.init_process_group('gloo', init_method='tcp://127.0.0.1:29531', rank=0,
world_size=1); print(open('/proc/self/status').read().split('VmRSS:')[1].split()[0], 'kB')"`
prints; `PROCESS_BYTES` rounds it up
for the data and the allocator's slack), the model states the planner predicts for this rank
(ZeRO formulas, `twin.predict.states`), and twice the activations one micro-batch saves for
backward (the saved tensors, and the gradients of the same size that backward creates while it
consumes them). On a machine where every rank is a process on the same host, the run needs
`ranks x that`; `available_bytes` is what the kernel says can be allocated without swapping
(MemAvailable), capped by the cgroup's limit when the process runs in one.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringzero.plan.strategies.memory import host_rank_bytes
from ringzero.twin import predict
from ringzero.run.config import TrainConfig

PROCESS_BYTES = 300 * 2**20


@dataclass(frozen=True)
class Footprint:
    ranks: int
    per_rank: int
    """Bytes one rank needs: the process, its model states and its activations."""
    states: int
    activations: int
    """Bytes of the activations (twice what one micro-batch saves: see `plan.strategies.memory.host_rank_bytes`)."""

    @property
    def total(self) -> int:
        return self.ranks * self.per_rank


def footprint(cfg: TrainConfig, world: int) -> Footprint:
    states = sum(predict.states(cfg, world).values())
    activations = predict.activations(cfg)
    return Footprint(world, host_rank_bytes(states, activations, PROCESS_BYTES), int(states), int(2 * activations))


def _cgroup_room() -> int | None:
    """Bytes left under this process's cgroup memory limit (v2, then v1), if it has one."""
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                          "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit) as f:
                text = f.read().strip()
            if text == "max" or int(text) >= 2**60:
                return None
            with open(usage) as f:
                return int(text) - int(f.read())
        except (OSError, ValueError):
            continue
    return None


def available_bytes() -> int | None:
    """Memory this machine can still give (MemAvailable, within the cgroup limit); None if unknown."""
    room = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    room = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    cgroup = _cgroup_room()
    if cgroup is not None:
        room = cgroup if room is None else min(room, cgroup)
    return room


def check(cfg: TrainConfig, world: int, force: bool = False) -> Footprint:
    """The run's footprint; ValueError (one line, with the numbers) if it does not fit in memory."""
    fp = footprint(cfg, world)
    room = available_bytes()
    if room is not None and fp.total > room and not force:
        gib = 2**30
        raise ValueError(
            f"{world} ranks need about {fp.total / gib:.1f} GiB ({fp.per_rank / gib:.2f} GiB each: "
            f"{PROCESS_BYTES / gib:.2f} process, {fp.states / gib:.2f} model states, "
            f"{fp.activations / gib:.2f} activations) but {room / gib:.1f} GiB is available; "
            f"use fewer ranks, a smaller --micro-batch or --seq, or --force")
    return fp
