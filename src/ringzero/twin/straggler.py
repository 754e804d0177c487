"""The injected straggler's forward and backward on ranks that share the cores.

`train.straggler` makes rank R sleep (F - 1) x its previous step's compute before its forward, so
its peers run their forward and backward during that sleep and then wait for R inside the step's
collectives (Ho et al. 2013 §1: the synchronous step is the slowest worker's). With more ranks than
cores that changes what R's own compute costs: the peers contend for the cores only until they are
done, and R finishes its pass with the cores to itself. The probe's block rate, timed with every
rank at once, prices R as if all ranks computed beside it the whole pass (measured with 4 ranks on
2 cores, straggler 1:2: the step 40-51 % below that prediction; `ringzero train --nproc 4
--straggler 1:2 --steps 40`, its step beside compute priced at the pooled block rate).

A fluid model of the steady state, from two probed rates: `together` the seconds of the pass with
every rank computing (the pooled block rate) and `alone` with the others waiting (the straggler's
`alone_flops`). A rank's speed, as a share of its speed alone, is s_all = alone / together while
all n ranks compute and s_peers = min(1, s_all · n / (n - 1)) while the n - 1 peers do (cores shared
evenly). In a step R sleeps S = (F - 1)·c, c its pass of the step before; meanwhile the peers do
S·s_peers of their pass (in seconds alone), leaving w = max(0, alone - S·s_peers). R then runs at
s_all until the peers' w is done (R's progress equals theirs: same shape, same share), then alone:

    c = w / s_all + (alone - w)

The fixed point c = alone·(1 + k) / (1 + (F - 1)·s_peers·k), k = 1/s_all - 1, when the peers do not
finish within the sleep; c = alone when they do ((F - 1)·s_peers >= 1). Without contention (s_all =
1) c = alone; without a straggler (F = 1) c = together.
"""

from __future__ import annotations


def straggler_pass_seconds(alone: float, together: float, world: int, factor: float) -> float:
    """The straggler's forward and backward per step in the steady state (module doc), from its
    pass timed alone and with every one of the `world` ranks computing."""
    if world == 1 or alone <= 0 or together <= alone:         # no contention to escape
        return together
    s_all = alone / together
    s_peers = min(1.0, s_all * world / (world - 1))
    if (factor - 1.0) * s_peers >= 1.0:
        return alone
    k = 1.0 / s_all - 1.0
    return alone * (1.0 + k) / (1.0 + (factor - 1.0) * s_peers * k)
