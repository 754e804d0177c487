"""Parallel training techniques applied to any `nn.Module`: `apply_*(model, topology, config)`.

The model code never knows it is being parallelised (the techniques are applied from outside, as
torchtitan's `apply_*` functions do); every collective goes through `ringzero.comm`, so the traffic
meter counts it and the planner predicts it. For your own model, start at `wrap` (`wrap.py`): one
call gives an engine with `backward`, `step`, `state_dict` and its twins. The folders hold one
technique each: `zero/`, `tp/`, `pp/`, `ps/`, `offload/`.

The names below are imported on first use (PEP 562), so that the torch-free configs
(`offload.config`) can be read before torch is imported.
"""

from __future__ import annotations

from ringzero.lazy import exports

_EXPORTS = {"wrap": "wrap", "Engine": "wrap", "AdamConfig": "optimizer"}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = exports(__name__, _EXPORTS, globals())
