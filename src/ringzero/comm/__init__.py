"""ringzero.comm: the eight collectives over point-to-point, each with its classic algorithms.

Drop-in for `torch.distributed` (same signatures, group ranks, sub-groups) with `algorithm=`:
"auto" (least predicted time under the calibrated α-β-γ model), "torch" (the backend's own), or a
named algorithm (see `ringzero.comm.registry.TABLE`). `TrafficMeter` records every byte.

The names below are imported on first use (PEP 562), so that the torch-free parts of the package
(`registry`, `config`, `select`) can be read by the planner and the command line without importing
torch.
"""

from __future__ import annotations

from ringzero.lazy import exports

_EXPORTS = {
    "all_reduce": "api", "reduce": "api", "broadcast": "api", "all_gather": "api",
    "all_gather_into_tensor": "api", "reduce_scatter": "api_movement", "reduce_scatter_tensor": "api_movement",
    "gather": "api_movement", "scatter": "api_movement", "all_to_all": "api_movement",
    "TrafficMeter": "meter", "Traffic": "meter", "Op": "ops",
    "CommConfig": "config", "configure": "config", "get_config": "config", "set_config": "config",
    "COLLECTIVES": "registry",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = exports(__name__, _EXPORTS, globals())
