"""ringzero.comm: the eight collectives over point-to-point, each with its classic algorithms.

Drop-in for `torch.distributed` (same signatures, group ranks, sub-groups) with `algorithm=`:
"auto" (least predicted time under the calibrated α-β-γ model), "torch" (the backend's own), or a
named algorithm (see `ringzero.comm.registry.TABLE`). `TrafficMeter` records every byte.
"""

from .api import all_gather, all_gather_into_tensor, all_reduce, broadcast, reduce
from .api_movement import all_to_all, gather, reduce_scatter, reduce_scatter_tensor, scatter
from .config import CommConfig, configure, get_config, set_config
from .meter import Traffic, TrafficMeter
from .ops import Op
from .registry import COLLECTIVES, algorithms

__all__ = [
    "all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "gather", "scatter", "all_to_all", "TrafficMeter", "Traffic", "Op",
    "CommConfig", "configure", "get_config", "set_config", "COLLECTIVES", "algorithms",
]
