"""Parallel training techniques applied to any `nn.Module`: `apply_*(model, topology, config)`.

The model code never knows it is being parallelised (the techniques are applied from outside, as
torchtitan's `apply_*` functions do); every collective goes through `ringzero.comm`, so the traffic
meter counts it and the planner predicts it.
"""
