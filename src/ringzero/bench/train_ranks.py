"""The rank side of `ringzero bench train`: every variant built on every rank, steps interleaved.

All variants train the same GPT (`train.model.GPT`, same seed, so the same initial weights), on the
same batches (`train.data.ByteData`, each rank its slice of the global batch), with the same AdamW
hyper-parameters, learning-rate schedule and gradient clipping, in fp32, each on its own gloo
process group:

- ringzero `dp` / `zero3`: `train.engine.Trainer` (the engine `ringzero train` runs), one
  `Trainer.step` per step.
- DDP: `torch.nn.parallel.DistributedDataParallel(bucket_cap_mb=...)` + `torch.optim.AdamW`
  (`Job.torch_adam`: foreach, torch's default, or fused) + `clip_grad_norm_`.
- FSDP2: `fully_shard` on every block, then on the root (reshard after forward: the blocks are
  gathered again for backward, as ringzero's ZeRO-3 does), + AdamW on the DTensor shards.
- torch pipelining (against ringzero's `--pp` over every rank): `torch.distributed.pipelining`'s
  ScheduleGPipe, Schedule1F1B and ScheduleInterleaved1F1B on the same chunks of the GPT
  (`bench.pp_peer`), + AdamW; ringzero runs the same schedule (`train.pipeline_schedule`).
- ringzero dp with gradient compression against DDP with torch's matching comm hook
  (`register_comm_hook`: fp16/bf16_compress_hook, powerSGD_hook; top-k: plain DDP), `bench.compress_peer`.
- torch tensor parallelism (against ringzero's `--tp` over every rank): `parallelize_module` with
  `ColwiseParallel` on qkv and the first MLP matrix and `RowwiseParallel` on the two output
  projections, + AdamW on the DTensors. The fused qkv rows are reordered first so that torch's
  contiguous split hands each rank whole heads of q, k and v (as ringzero's split by heads does), so
  both compute the same model; torch keeps the embedding, head and loss replicated, ringzero splits
  them by vocabulary.

Steps are interleaved (step i of every variant, in an order rotated by i) and each starts after a
barrier, so drift in the machine's load hits all variants alike; every rank times its own step and
the parent takes the max over ranks. After the timed steps, one more step per variant measures
model-state bytes (see `_Torch.transient` and `_Ringzero.transient` for what is counted) and its loss,
the loss after the N timed updates.

Recomputation runs on rank 0 alone (`bench.recompute_ranks`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

import torch
import torch.distributed as dist

from ringzero import comm
from ringzero.parallel.topology import Topology
from ringzero.run.config import TrainConfig
from ringzero.train.data import ByteData, load_bytes
from ringzero.train.engine import RankResult, Trainer
from ringzero.train.model import GPT
from ringzero.bench import compress_peer, pp_peer, tp_peer
from ringzero.bench.recompute_ranks import recompute
from ringzero.bench.train_job import Job, interleaved

SUITES = {"dp": ("rz_dp", "ddp"), "zero3": ("rz_zero3", "fsdp2"), "tp": ("rz_tp", "torch_tp"),
          "pp_gpipe": ("rz_pp_gpipe", "torch_pp_gpipe"), "pp_1f1b": ("rz_pp_1f1b", "torch_pp_1f1b"),
          "pp_interleaved": ("rz_pp_interleaved", "torch_pp_interleaved")}
PIPELINE_SUITES = ("pp_gpipe", "pp_1f1b", "pp_interleaved")


def _nbytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


@contextlib.contextmanager
def _sampling(fn):
    """Sample `fn()` whenever autograd saves (forward) or unpacks (backward) a tensor: the moments
    when a layer computes, so its weights are gathered. Yields a one-element list: the max seen."""
    peak = [0]

    def hook(t):
        peak[0] = max(peak[0], fn())
        return t
    with torch.autograd.graph.saved_tensors_hooks(hook, hook):
        yield peak


class _Ringzero:
    def __init__(self, cfg: TrainConfig, group) -> None:
        topology = Topology.build(cfg.placement(dist.get_world_size(group)), group) if cfg.parallel.tp * cfg.parallel.pp > 1 \
            else Topology.data_parallel(group)
        self.trainer = Trainer(cfg, topology)
        self.res = RankResult(rank=dist.get_rank())
        self.sh = self.trainer.strategy

    def step(self, i: int, measure: bool = False) -> tuple[float, dict]:
        if not measure:
            ph, loss = self.trainer.step(i, self.res)
            return loss, ph
        with _sampling(self.transient) as peak:
            ph, loss = self.trainer.step(i, self.res)
        self.peak = peak[0]
        return loss, ph

    def transient(self) -> int:
        """Full-size buffers alive now: gathered layers, all-gather outputs being filled, unreduced
        gradient flats and parameter gradients not yet copied into one (ZeRO-3's root)."""
        return self.sh.transient_bytes()

    def states(self) -> dict:
        """The strategy's `held_bytes()` (taken by the engine after backward, before the update) and
        `ShardedAdam.state_bytes()`."""
        return {**self.res.held, "transient_peak": self.peak}

    def close(self) -> None:
        self.trainer.close()


class _Torch:
    def __init__(self, kind: str, cfg: TrainConfig, group, data: ByteData, adam: str) -> None:
        self.kind, self.cfg, self.data, self.group = kind, cfg, data, group
        torch.manual_seed(cfg.training.seed)
        model = GPT(cfg.shape, attention=cfg.model.attention)
        if kind == "ddp":
            from torch.nn.parallel import DistributedDataParallel
            self.model = DistributedDataParallel(model, process_group=group, bucket_cap_mb=cfg.parallel.bucket_mb)
        elif kind == "torch_tp":
            self.model = tp_peer.parallelize(model, group)
        else:
            from torch.distributed.device_mesh import DeviceMesh
            from torch.distributed.fsdp import fully_shard
            mesh = DeviceMesh.from_group(group, "cpu")
            for block in model.blocks:
                fully_shard(block, mesh=mesh)
            self.model = fully_shard(model, mesh=mesh)
            self.units = [model, *model.blocks]
        # torch's foreach/fused kernels take DTensors or plain tensors, not both in one list: under
        # tensor parallelism the split weights and the replicated rest get an optimizer each.
        params = list(self.model.parameters())
        kinds = [[p for p in params if tp_peer.is_dtensor(p) == d] for d in (True, False)]
        self.opts = [torch.optim.AdamW(ps, lr=cfg.optim.lr, betas=cfg.optim.betas, eps=cfg.optim.eps, weight_decay=cfg.optim.weight_decay,
                                       **{adam: True}) for ps in kinds if ps]
        self.group = group
        self.dp, self.rank = (1, 0) if kind == "torch_tp" else (dist.get_world_size(group), dist.get_rank(group))

    def step(self, i: int, measure: bool = False) -> tuple[float, dict]:
        c = self.cfg
        x, y = self.data.batch("train", i, c.global_batch(self.dp), self.rank, self.dp)
        for g in (g for opt in self.opts for g in opt.param_groups):
            g["lr"] = c.lr_at(i)
        with _sampling(self.transient) if measure else contextlib.nullcontext() as peak:
            t0 = time.perf_counter()
            loss = self.model(x, y)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
        if measure:
            self.peak, self.held = peak[0], self._held()
        if c.optim.clip is not None and self.kind == "torch_tp":
            tp_peer.clip_grad_norm(list(self.model.parameters()), c.optim.clip, self.group)
        elif c.optim.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), c.optim.clip)
        for opt in self.opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
        value = loss.item()
        t3 = time.perf_counter()
        return value, {"forward": t1 - t0, "backward": t2 - t1, "comm": 0.0, "optimizer": t3 - t2}

    def _params(self):
        return [fp for m in self.units for fp in m._get_fsdp_state()._fsdp_param_group.fsdp_params]

    def transient(self) -> int:
        """FSDP2: the all-gather outputs (unsharded weights) not freed yet, a prefetched layer's flat
        all-gather buffer, unsharded gradients not reduce-scattered yet and the reduce-scatter
        inputs FSDP2 keeps. Distinct storages, by size (a freed output has storage of size 0)."""
        if self.kind != "fsdp2":
            return 0
        seen: dict[int, int] = {}

        def add(t):
            if t is not None and t.untyped_storage().nbytes():
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        for m in self.units:
            pg = m._get_fsdp_state()._fsdp_param_group
            if pg._all_gather_result is not None:
                add(pg._all_gather_result.all_gather_output)
            for fp in pg.fsdp_params:
                for t in fp.all_gather_outputs:
                    add(t)
                p = getattr(fp, "_unsharded_param", None)
                add(p.grad if p is not None else None)
                add(getattr(fp, "unsharded_accumulated_grad", None))
            for st in pg.comm_ctx.reduce_scatter_states:
                add(st.reduce_scatter_input)
        return sum(seen.values())

    def _held(self) -> dict:
        """Per rank, after backward: weights (FSDP2: the padded local shards), gradients and
        AdamW's state (exp_avg, exp_avg_sq, step)."""
        def local(t):
            return t.to_local() if hasattr(t, "to_local") else t
        if self.kind == "fsdp2":
            params = sum(fp._sharded_param_data.numel() * fp._sharded_param_data.element_size()
                         for fp in self._params())
        else:
            params = _nbytes(local(p) for p in self.model.parameters())
        grads = _nbytes(local(p.grad) for p in self.model.parameters() if p.grad is not None)
        opt = _nbytes(local(t) for o in self.opts for s in o.state.values() for t in s.values() if torch.is_tensor(t))
        return {"params": params, "grads": grads, "optimizer": opt}

    def states(self) -> dict:
        return {**self.held, "transient_peak": self.peak}

    def close(self) -> None:
        pass


def _build(name: str, job: Job, group, data: ByteData):
    if name.startswith("rz_dp_"):
        return _Ringzero(job.compress_cfg, group)
    if name.startswith("ddp_"):           # DDP with torch's comm hook of the compress suite's scheme
        v = _Torch("ddp", job.cfg, group, data, job.torch_adam)
        compress_peer.register_torch_hook(v.model, job.compress_cfg, group)
        return v
    if name.startswith(("rz_pp_", "torch_pp_")):
        schedule = name.rsplit("_", 1)[1]
        cfg = dataclasses.replace(job.pp_cfg, schedule=schedule,
                                  virtual_stages=2 if schedule == "interleaved" else 1)
        return _Ringzero(cfg, group) if name.startswith("rz_") else pp_peer.Variant(cfg, group, data)
    if name == "rz_tp":
        return _Ringzero(dataclasses.replace(job.cfg, strategy="dp", tp=dist.get_world_size(group)), group)
    if name.startswith("rz_"):
        return _Ringzero(dataclasses.replace(job.cfg, strategy=name[3:]), group)
    return _Torch(name, job.cfg, group, data, job.torch_adam)


def _training(job: Job) -> dict:
    cfg = job.cfg
    data = ByteData(load_bytes(cfg.training.data, cfg.training.max_bytes), cfg.shape.seq, seed=cfg.training.seed)
    out: dict = {}
    for suite in (*SUITES, "compress"):
        if suite not in job.suites:
            continue
        variants, errors = {}, {}
        for name in compress_peer.variants(job.compress_cfg) if suite == "compress" else SUITES[suite]:
            group = dist.new_group(backend="gloo")
            try:
                variants[name] = _build(name, job, group, data)
            except Exception as exc:       # e.g. FSDP2 unsupported here: reported, never faked
                errors[name] = f"{type(exc).__name__}: {exc}"
        if errors:
            for v in variants.values():
                v.close()
            out[suite] = {"errors": errors}
            continue
        res = interleaved(variants, cfg.training.steps, dist.barrier)
        for name, v in variants.items():   # the measuring step, after the timed ones
            dist.barrier()
            res[name]["loss_after"], _ = v.step(cfg.training.steps, measure=True)
            res[name]["states"] = v.states()
            v.close()
        out[suite] = res
    return out


def rank_main(job: Job) -> dict:
    """Runs on every rank; returns this rank's measurements (plain data)."""
    with comm.configure(transport=job.cfg.parallel.transport):
        out = _training(job)
    if "recompute" in job.suites:
        if dist.get_rank() == 0:
            out["recompute"] = recompute(job)
        dist.barrier()
    return out
