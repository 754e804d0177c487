"""What every rank of a training run builds from its configuration, whichever loop trains it (the
data-parallel grid's `engine.Trainer` or a parameter server's worker, `ps_engine.PSWorker`): its
copy of the model, the data and its share of each step's batch, Adam's hyperparameters. A
parameter server builds the model too, for the initial values and bucket layout of its range.

Order of application (torchtitan's): model -> precision (cast) -> tensor parallelism ->
recomputation -> pipeline cut (this rank's stage) -> sharding (DP/ZeRO over the dp group) -> its
communication hook (gradient compression, `parallel.compression`). Every
rank seeds the same generator before the model is built, and the first rank's weights are broadcast
before any split (`parallel.replicas`), so every replica starts from the same weights.
"""

from __future__ import annotations

import torch

from ringzero.parallel.comm_queue import CommQueue
from ringzero.parallel.compression import hook_for
from ringzero.parallel.optimizer import AdamConfig
from ringzero.parallel.pp.pipeline import apply_pipeline
from ringzero.parallel.precision import dtype
from ringzero.parallel.recompute import apply_recompute
from ringzero.parallel.replicas import broadcast_module
from ringzero.parallel.sharding_config import ShardingConfig
from ringzero.parallel.strategies import apply_sharding
from ringzero.parallel.tp.grads import unshard
from ringzero.parallel.tp.tensor_parallel import apply_tensor_parallel
from ringzero.parallel.topology import Topology
from ringzero.run import compress_options, zero_options
from ringzero.run.config import TrainConfig
from ringzero.train import offloading
from ringzero.train.data import ByteData, load_bytes
from ringzero.train.model import GPT, AttentionCore


class Replica:
    """The model as `topology` runs it on this rank (`stages`: its pipeline stages, None without a
    pipeline), with the comm queue its sharding strategy submits to."""

    def __init__(self, cfg: TrainConfig, topology: Topology) -> None:
        self.cfg, self.topo = cfg, topology
        torch.manual_seed(cfg.training.seed)
        self.model = GPT(cfg.shape, attention=cfg.model.attention, dropout=cfg.model.dropout).to(dtype(cfg.optim.precision))
        if topology.world > 1:          # the same seed on another device or torch build may draw otherwise
            broadcast_module(self.model, topology.grid_group)
        self.tp = apply_tensor_parallel(self.model, topology, sequence_parallel=cfg.parallel.sequence_parallel,
                                        algorithm=cfg.parallel.tp_algorithm, seed=cfg.training.seed)
        apply_recompute(self.model, cfg.training.recompute, (AttentionCore,), self.tp.rng.checkpoint_context
                        if topology.tp > 1 else None)
        self.stages = apply_pipeline(self.model, topology, cfg.parallel.virtual_stages, cfg.parallel.sequence_parallel,
                                     cfg.parallel.tp_algorithm) if topology.pp > 1 else None
        self.queue = CommQueue()
        # a compression that keeps state per bucket must see the tied embedding alike on its first
        # and last stage: alone in its bucket there
        tied = self.stages.tied_weight() if self.stages is not None else None
        alone = (tied,) if tied is not None and compress_options.compression(cfg).stateful else ()
        self.strategy = apply_sharding(self.model, topology, ShardingConfig(
            sharding=cfg.sharding, bucket_mb=cfg.parallel.bucket_mb, prefetch=cfg.zero.prefetch,
            algorithm=cfg.parallel.comm_algorithm, zeropp=zero_options.zeropp(cfg, topology.world),
            offload_params=offloading.param_offload(cfg)), self.queue, alone)
        hook = hook_for(compress_options.compression(cfg), compress_options.start(cfg), seed=cfg.training.seed)
        if hook is not None:
            self.strategy.register_comm_hook(hook)

    def full_params(self) -> dict[str, list[float]]:
        """Every parameter of this rank's pipeline stage, its full value (gathered over dp when
        sharded, over tp when split), by name, as flat float lists."""
        params = dict(self.model.named_parameters())
        return {k: unshard(v, params[k], self.topo, self.cfg.parallel.tp_algorithm).float().reshape(-1).tolist()
                for k, v in self.strategy.full_params().items()}

    def close(self) -> None:
        self.strategy.close()
        self.queue.close()


def train_data(cfg: TrainConfig) -> ByteData:
    """The run's corpus, split and batched the same way on every rank (`train.data`)."""
    return ByteData(load_bytes(cfg.training.data, cfg.training.max_bytes), cfg.shape.seq, seed=cfg.training.seed)


def micro_batches(data: ByteData, cfg: TrainConfig, step: int, global_batch: int, share: int,
                  shares: int) -> list:
    """Share `share` of `shares` of step `step`'s `global_batch` sequences, cut into `cfg.training.grad_accum`
    micro-batches of (inputs, targets)."""
    x, y = data.batch("train", step, global_batch, share, shares)
    return list(zip(x.chunk(cfg.training.grad_accum), y.chunk(cfg.training.grad_accum)))


def adam_config(cfg: TrainConfig) -> AdamConfig:
    return AdamConfig(lr=cfg.optim.lr, betas=cfg.optim.betas, eps=cfg.optim.eps, weight_decay=cfg.optim.weight_decay, clip=cfg.optim.clip)
