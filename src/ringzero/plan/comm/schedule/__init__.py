"""A collective algorithm as data: its global steps of concurrent flows, what the simulator plays.

- `step`: the `Step` (flows that go at once, possibly repeated) and `Schedule` types, expansion to
  (step, src, dst, bytes) messages and the memory bound of a compressed schedule;
- `asap`: any algorithm's steps from its per-rank messages (`plan.comm.links`), numbered as the
  ranks really take them: a rank's round starts one step after the latest message it received;
- `rings`: the ring-based algorithms in compressed form (n-1 steps of one shape stored once), so a
  16,384-rank ring is a few steps, not n·2(n-1) messages.

Pure Python: no torch, no numpy.
"""
