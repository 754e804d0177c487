"""Checkpoints of a parameter-server run, in the format of every other layout.

The servers hold the state: server s owns [lo, hi) of the flat parameter vector (the worker's
buckets in order), its values, fp32 master and Adam's moments. Cut by the parameters' offsets in
that vector, the range is pieces of global tensors ("param/", "master/", "exp_avg/",
"exp_avg_sq/"), which is all a manifest needs: a parameter-server checkpoint loads into data
parallelism, ZeRO or tensor parallelism, and theirs into a parameter server.

Saving. A server writes its pieces when its clock (the slowest worker's step) reaches a saving
step k; every worker writes its RNG state after its own step k; worker 0, rank 0, publishes once
every rank's marker is there (`checkpoint.save.write`), on a thread of its own, so that no worker
waits for a save. Resuming, every worker continues from step k and every server loads its range,
its optimizer's step count and sets every worker's clock to k.

What step k means depends on the consistency model (Li et al. 2014, OSDI §4.3 checkpoint each
server's range on its own, as here):

- sync: every update of steps < k and none after: resumed in the same layout, the run continues
  bit for bit.
- async and ssp have no global step. A server's range is taken when its slowest worker's push of
  step k − 1 has been applied; a faster worker's pushes of later steps may already be in it (ssp:
  at most S steps' worth), and each server is taken at its own moment. Resuming, those faster
  workers run their steps after k again, on weights that hold them once already: the restart
  costs what an asynchronous run's staleness costs, never a state that does not exist.
"""

from __future__ import annotations


import torch
import torch.distributed as dist

from ringzero.checkpoint.folders import resolve
from ringzero.checkpoint.load import Reader, fill
from ringzero.checkpoint.save import snapshot, write
from ringzero.checkpoint.state import Local, pieces
from ringzero.train.checkpointing import Behind, ancestors, due, run_token


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
              "ps_mode": cfg.ps.ps_mode, "precision": cfg.optim.precision}
    return {"layout": layout, "config": cfg.as_dict(), "scaler": {}, "optimizer_step": step}


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
        self.ancestors = ancestors(cfg)
        self.last = -1
        """The newest step this rank saved (async: the server's clock passes each step many times)."""
        self.behind = Behind()

    def save(self, step: int, locals_: list[Local]) -> None:
        """Write this rank's part of the checkpoint after `step` steps (a server, now: its range
        changes under the next update) ."""
        self.last = step
        write(self.cfg.checkpoint.save_dir, self._snapshot(step, locals_))

    def save_behind(self, step: int) -> None:
        """A worker's part (its RNG state) on a background thread: worker 0 publishes the
        checkpoint there once the servers' markers are in, which its own steps must not wait for.
        No deadline on those markers: they come when the slowest worker reaches `step` (under
        async, any number of steps behind worker 0), and a dead rank ends the job anyway."""
        self.behind.start(write, self.cfg.checkpoint.save_dir, self._snapshot(step, []), None)

    def _snapshot(self, step: int, locals_: list[Local]):
        meta = _meta(self.cfg, self.workers, self.servers, step)
        return snapshot(step, self.rank, self.workers + self.servers, locals_, {"torch": torch.get_rng_state()},
                        meta, self.token, self.cfg.checkpoint.keep, copy=False, ancestors=self.ancestors,
                        overwrite=self.cfg.checkpoint.overwrite)

    def wait(self) -> None:
        """Wait for the save in flight; raise its error."""
        self.behind.wait()

    def after_update(self, server, strategy, lo: int, hi: int):
        """The server's hook, called with its clock after each update is answered: save when the
        clock first reaches a saving step."""
        def hook(clock: int) -> None:
            if clock > self.last and due(self.cfg, clock):
                self.save(clock, range_pieces(strategy, lo, hi, server_tensors(server)))
        return hook


@torch.no_grad()
def resume_worker(replica, index: int, workers: int, path: str, group) -> int:
    """Load the weights into worker `index`'s (of `workers`) `replica` (and its RNG state, from a
    checkpoint of this very layout); returns the step to continue from."""
    reader = Reader(resolve(path))
    fill(reader, pieces(replica.strategy, replica.topo, None, writing=False))
    m, world = reader.manifest, dist.get_world_size(group)
    if m.layout == _meta(replica.cfg, workers, world - workers, 0)["layout"]:
        saved = reader.rng(index)
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
