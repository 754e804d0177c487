"""Per-algorithm traffic formulas, one file per file of `ringzero.comm.algorithms`.

Each module has one function per collective, `f(call: Call, rank: int) -> Volume`, called by
`ringzero.plan.comm.volume.volume` (which already handles n == 1 and empty buffers).
"""
