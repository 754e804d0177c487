"""A run's offload as the engine builds it: the `OffloadConfig` of the optimizer's states and of
ZeRO-3's weight shards, from the run's fields (checked in `run.zero_options`)."""

from __future__ import annotations

from ringzero.parallel.offload.config import OffloadConfig


def optimizer_offload(cfg):
    """The run's `parallel.offload.optimizer.OffloadConfig` for the optimizer states (device "none" without)."""
    nvme = cfg.zero.offload_optimizer == "nvme"
    return OffloadConfig(device=cfg.zero.offload_optimizer, nvme_path=cfg.zero.nvme_path if nvme else None,
                         buffer_count=cfg.zero.offload_buffers, pin_memory=cfg.zero.offload_pin_memory)


def param_offload(cfg):
    """The run's `OffloadConfig` for ZeRO-3's weight shards, or None when they stay on the device."""
    if cfg.zero.offload_params == "none":
        return None
    nvme = cfg.zero.offload_params == "nvme"
    return OffloadConfig(device=cfg.zero.offload_params, nvme_path=cfg.zero.nvme_path if nvme else None,
                         buffer_count=cfg.zero.offload_buffers, pin_memory=cfg.zero.offload_pin_memory)
