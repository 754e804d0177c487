"""Before any rank starts: can the transport asked for run here, and does /dev/shm hold its slots?

Torch-free, so the command line answers at once. Transport "shm" with ranks on several hosts (a
torchrun job whose WORLD_SIZE is more than its LOCAL_WORLD_SIZE), without a /dev/shm, or with less
room in /dev/shm than the run's channels can take is bad input (one line, exit 2). Under "auto"
the same shortage makes the run use the backend's point-to-point, and says so.
"""

from __future__ import annotations

import os
import sys

from ringzero.comm.transport import layout, segment


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def transport_for(transport: str, group_sizes, torchrun: bool, env=None) -> tuple[str, str | None]:
    """(the transport to run, a note for the user or None); raises ValueError when `transport`
    cannot run here. `group_sizes`: the sizes of every group the run's ranks talk in."""
    env = os.environ if env is None else env
    if transport == "gloo":
        return transport, None
    world, local = int(env.get("WORLD_SIZE", 0) or 0), int(env.get("LOCAL_WORLD_SIZE", 0) or 0)
    if transport == "shm" and torchrun and local and world > local:
        raise ValueError(f"--transport shm needs every rank on one host; this torchrun job has {world} ranks, "
                         f"{local} per host: use --transport auto (shared memory inside each host) or gloo")
    if not (sys.platform.startswith("linux") and os.path.isdir(segment.DIR)):
        if transport == "shm":
            raise ValueError(f"--transport shm needs {segment.DIR} (Linux shared memory); use auto or gloo")
        return "gloo", None
    need, free = layout.channels_bytes(group_sizes), segment.free_bytes()
    if need > free:
        if transport == "shm":
            raise ValueError(f"--transport shm needs up to {_mib(need)} in {segment.DIR} for its channels, which has "
                             f"{_mib(free)} free: free some (or mount it larger), or use --transport gloo")
        return "gloo", (f"ringzero: {segment.DIR} has {_mib(free)} free, the shared-memory channels may need "
                        f"{_mib(need)}: messages take gloo")
    return transport, None


def grid_groups(world: int, dp: int, tp: int, pp: int) -> list[int]:
    """Sizes of the groups a dp x tp x pp run talks in: each dimension's, dp x tp, and the world."""
    sizes = [world]
    for k in (dp, tp, pp, dp * tp):
        if 1 < k < world:
            sizes += [k] * (world // k)
    return sizes
