"""Checkpoints of a synchronous parameter-server run, in the format of every other layout.

The servers hold the state: server s owns [lo, hi) of the flat parameter vector (the worker's
buckets in order), its values, fp32 master and Adam's moments. Cut by the parameters' offsets in
that vector, the range is pieces of global tensors ("param/", "master/", "exp_avg/",
"exp_avg_sq/"), which is all a manifest needs: a parameter-server checkpoint loads into data
parallelism, ZeRO or tensor parallelism, and theirs into a parameter server.

Saving (sync only: there every worker and server agree on the step). A server writes its pieces
once its clock reaches a saving step; every worker writes its RNG state after that step; worker
0, rank 0, publishes once every rank's marker is there (`checkpoint.save.write`). Resuming, a
worker loads the weights and a server its range, its optimizer's step count and its clock.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from ..checkpoint.load import Reader, fill, resolve
from ..checkpoint.save import snapshot, write
from ..checkpoint.state import Local, pieces
from .checkpointing import due, run_token


def range_pieces(strategy, lo: int, hi: int, tensors: dict[str, torch.Tensor]) -> list[Local]:
    """The pieces of global tensors that [lo, hi) of the flat vector over `strategy`'s buckets is;
    `tensors`: kind ("param", "master", ...) -> this range's values (1-D, hi - lo long)."""
    names = {id(p): n for n, p in strategy.model.named_parameters()}
    out, base = [], 0
    for g in strategy.groups:
        b = g.bucket
        for i, p in enumerate(b.params):
            a, z = max(lo, base + b.offsets[i]), min(hi, base + b.offsets[i + 1])
            if a < z:
                flat = (a - base - b.offsets[i], z - base - b.offsets[i])
                for kind, t in tensors.items():
                    out.append(Local(f"{kind}/{names[id(p)]}", t[a - lo:z - lo], flat, None, tuple(b.shapes[i])))
        base += b.numel
    return out


def _meta(cfg, workers: int, servers: int, step: int) -> dict:
    layout = {"world": workers + servers, "dp": workers, "tp": 1, "pp": 1, "strategy": "ps", "servers": servers,
              "precision": cfg.precision}
    return {"layout": layout, "config": dataclasses.asdict(cfg), "scaler": {}, "optimizer_step": step}


def server_tensors(server) -> dict[str, torch.Tensor]:
    opt = server.opt
    out = {"param": server.shard, "exp_avg": opt.exp_avg[0], "exp_avg_sq": opt.exp_avg_sq[0]}
    if opt.mixed:
        out["master"] = opt.master[0]
    return out


class PSSaver:
    """One rank's side of a parameter-server checkpoint (see the module doc)."""

    def __init__(self, cfg, rank: int, workers: int, servers: int, group) -> None:
        self.cfg, self.rank, self.workers, self.servers = cfg, rank, workers, servers
        self.token = run_token(group, workers + servers)

    def save(self, step: int, locals_: list[Local]) -> None:
        """Write this rank's part of the checkpoint after `step` steps (rank 0 publishes it)."""
        meta = _meta(self.cfg, self.workers, self.servers, step)
        snap = snapshot(step, self.rank, self.workers + self.servers, locals_, {"torch": torch.get_rng_state()},
                        meta, self.token, self.cfg.keep, copy=False)
        write(self.cfg.save_dir, snap)

    def after_update(self, server, strategy, lo: int, hi: int):
        """The server's hook: save when its clock reaches a saving step."""
        def hook(clock: int) -> None:
            if due(self.cfg, clock):
                self.save(clock, range_pieces(strategy, lo, hi, server_tensors(server)))
        return hook


@torch.no_grad()
def resume_worker(worker, path: str, group) -> int:
    """Load the weights into `worker` (and its RNG state, from a checkpoint of this very layout);
    returns the step to continue from."""
    reader = Reader(resolve(path))
    fill(reader, pieces(worker.strategy, worker.topo, None, writing=False))
    m, world = reader.manifest, dist.get_world_size(group)
    if m.layout == _meta(worker.cfg, worker.count, world - worker.count, 0)["layout"]:
        saved = reader.rng(worker.index)
        if "torch" in saved:
            torch.set_rng_state(saved["torch"])
    return m.step


@torch.no_grad()
def resume_server(server, strategy, lo: int, hi: int, path: str) -> None:
    """Load server `server`'s range, optimizer step count and clock from checkpoint `path`."""
    reader = Reader(resolve(path))
    fill(reader, range_pieces(strategy, lo, hi, server_tensors(server)))
    if not server.opt.mixed:
        server.opt.master[0].copy_(server.shard)
    server.opt.t = reader.manifest.optimizer_step
    for w in server.clock:
        server.clock[w] = reader.manifest.step
