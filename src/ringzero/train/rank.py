"""One rank's training run, whichever kind it is: a grid of dp x tp x pp ranks (`engine.Trainer`)
or a parameter server's worker or server (`ps_engine`)."""

from __future__ import annotations

import torch.distributed as dist

from ringzero import comm
from ringzero.parallel.topology import Topology
from ringzero.run import zero_options
from ringzero.run.config import TrainConfig
from ringzero.run.kind import RunKind
from ringzero.run.result import RankResult
from ringzero.train.engine import Trainer
from ringzero.train.ps_engine import train_ps_rank


def train_rank(cfg: TrainConfig, progress=None, keep_params: bool = False, group=None,
               calibrate: bool = True) -> RankResult:
    """Run `cfg` on this rank of `group` (default: the whole job; alone when there is no process group)."""
    world = dist.get_world_size(group) if dist.is_initialized() else 1
    if cfg.kind is RunKind.PARAMETER_SERVER:
        with comm.configure(**zero_options.comm_settings(cfg)):
            return train_ps_rank(cfg, group, progress, keep_params)
    placement = cfg.placement(world)                 # tp and dp against the ranks: one line if wrong
    zpp = zero_options.zeropp(cfg, world)
    if world == 1:
        topo = Topology.alone()
    elif placement.tp == 1 and placement.pp == 1 and zpp is None:
        topo = Topology.data_parallel(group, placement.ranks_per_node)
    else:
        topo = Topology.build(placement, group, zpp.partition if zpp is not None else None)
    if cfg.kind is RunKind.SINGLE and topo.world != 1:
        raise ValueError(f"strategy 'single' runs on one rank, not {topo.world}")
    with comm.configure(**zero_options.comm_settings(cfg)):
        return Trainer(cfg, topo).run(progress, keep_params, calibrate)
