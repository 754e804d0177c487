"""Parallel training techniques applied to any `nn.Module`: `apply_*(model, topology, config)`.

The model code never knows it is being parallelised (DESIGN.md); every collective goes through
`ringzero.comm`, so the traffic meter counts it and the planner predicts it.
"""
