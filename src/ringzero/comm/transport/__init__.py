"""How ringzero's point-to-point messages travel: the backend's, or shared memory between processes.

    with comm.configure(transport="shm"):       # "auto" (default), "shm" or "gloo"
        comm.all_reduce(t, algorithm="ring")

- `hosts`: which ranks share a host (a host id per rank, never LOCAL_WORLD_SIZE), the job's token.
- `segment`: /dev/shm segments made private (0600, O_EXCL), checked, unlinked once both ends hold
  them, swept if a job died before that.
- `sem`: process-shared semaphores in a segment; spin briefly with sched_yield, then block.
- `channel`: one direction between two ranks, a single-producer single-consumer ring of slots;
  `outbound` and `inbound` its two ends.
- `shm`: a group's `send`/`recv` over those channels, in a gloo ProcessGroup's shape.
- `shared`: tensors in shared memory that the peers of this host have mapped, whose messages go
  by reference (registered buffers); `regions` keeps track of them.
- `route`: `p2p` and `in_use` below; `layout`: a segment's bytes; `preflight`: checks before ranks start.

`p2p(group, device)` is what the algorithms' `TorchComm` and `comm.point_to_point` post their
messages on: the group's `ProcessGroup` (transport "gloo", and CUDA tensors under NCCL), or its
`ShmGroup`, which sends to peers on this host through shared memory and to the others through
the backend (transport "auto"; "shm" refuses them). The parameter server's headers, which its
any-source receive takes, always go through the backend (`point_to_point.post(backend=True)`).
"""

from __future__ import annotations

from ringzero.lazy import exports

_EXPORTS = {"p2p": "route", "in_use": "route", "available": "route"}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = exports(__name__, _EXPORTS, globals())
