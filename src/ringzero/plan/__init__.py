"""Pure formulas (no torch import): chunking, communication volume per algorithm, α-β-γ cost.

Everything else in ringzero (the collectives, the traffic-meter tests, the cost model that picks
an algorithm) calls these functions instead of re-deriving them.
"""
