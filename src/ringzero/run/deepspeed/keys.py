"""What ringzero does with each key of a DeepSpeed config (docs/deepspeed.md is the same table in prose).

Three kinds. MAPPED keys set a `TrainConfig` field (`deepspeed.py` reads them). TUNING keys only
tune DeepSpeed's own implementation (its buffers, its overlap, its logging): ringzero accepts them
with one warning line saying why they have no effect here. REFUSED keys ask for something ringzero
does not have (a different model, precision or batch schedule): accepted quietly when off, refused
in one line when on. Any other key is refused, with the closest known key suggested. Keys are
dotted paths from the top of the file ("zero_optimization.overlap_comm").
"""

from __future__ import annotations

import difflib

_OFFLOAD = {"device", "nvme_path", "pin_memory", "buffer_count"}
_WARMUP = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "total_num_steps",
           "last_batch_iteration", "warmup_min_ratio", "cos_min_ratio"}
MAPPED: dict[str, set[str]] = {
    "": {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
         "steps_per_print", "optimizer", "scheduler", "fp16", "bf16", "bfloat16", "zero_optimization",
         "tensor_parallel", "communication_data_type"},
    "zero_optimization": {"stage", "reduce_bucket_size", "allgather_bucket_size", "offload_optimizer",
                          "offload_param", "zero_quantized_weights", "zero_quantized_gradients",
                          "zero_hpz_partition_size"},
    "zero_optimization.offload_optimizer": _OFFLOAD,
    "zero_optimization.offload_param": _OFFLOAD,
    "fp16": {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
             "consecutive_hysteresis", "min_loss_scale"},
    "bf16": {"enabled"},
    "optimizer": {"type", "params"},
    "optimizer.params": {"lr", "betas", "eps", "weight_decay", "adam_w_mode", "bias_correction"},
    "scheduler": {"type", "params"},
    "scheduler.params": _WARMUP,
    "tensor_parallel": {"autotp_size"},
}
"""Section -> the keys of it that `deepspeed.py` maps onto TrainConfig fields."""

_LOGS = "ringzero writes its measurements to the table and --json-report"
_STAGE3_CACHE = "ringzero's ZeRO-3 holds the current layer and the `prefetch` layers ahead only, and caches none"
_SWAP = "ringzero's NVMe swap always overlaps reads and writes with the update, in buffer_count buffers"
TUNING: dict[str, str] = {
    "wall_clock_breakdown": "ringzero times every step's phases itself and prints them beside the plan",
    "memory_breakdown": "ringzero measures the bytes each rank holds and prints them beside the plan",
    "flops_profiler": "ringzero has no FLOPs profiler; `ringzero plan` counts a step's FLOPs",
    "tensorboard": _LOGS, "wandb": _LOGS, "csv_monitor": _LOGS, "comet": _LOGS,
    "comms_logger": "ringzero's traffic meter records every collective and the report prints its bytes",
    "dump_state": "ringzero prints no DeepSpeed engine state",
    "timers": "DeepSpeed's throughput timers; ringzero times every step itself",
    "zero_allow_untested_optimizer": "ringzero runs its own Adam under every ZeRO stage",
    "zero_force_ds_cpu_optimizer": "ringzero's offloaded optimizer is its own Adam on the host",
    "autotuning": "ringzero picks a layout with --layout auto (`ringzero.plan`), not DeepSpeed's autotuner",
    "aio": "DeepSpeed's libaio settings; ringzero's NVMe swap uses its own files and buffer_count buffers",
    "checkpoint": "DeepSpeed's checkpoint engine; ringzero writes its own checkpoints (--save-dir), loadable "
                  "in any layout",
    "compile": "ringzero does not torch.compile the model",
    "prescale_gradients": "ringzero sums the gradients and divides once, in the optimizer's fp32 step",
    "gradient_predivide_factor": "ringzero sums the gradients and divides once, in the optimizer's fp32 step",
    "sparse_gradients": "ringzero's embedding has dense gradients",
    "seq_parallel_communication_data_type": "ringzero's collectives carry activations in the training precision",
    "data_types": "ringzero accumulates gradients in the training precision (grad_accum_dtype is not used)",
    "pipeline": "DeepSpeed's PipelineModule options; ringzero's pipeline is set by --pp, --schedule and "
                "--virtual-stages",
    "eigenvalue": "it feeds DeepSpeed's quantization schedule, which ringzero does not have",
    "activation_checkpointing": "it configures deepspeed.checkpointing, which model code calls; ringzero "
                                "recomputes with --recompute selective or full and keeps checkpoints whole on "
                                "the device (no partition_activations, no cpu_checkpointing)",
    "zero_optimization.overlap_comm": "ringzero always overlaps (buckets reduce on its communication thread "
                                      "during backward; ZeRO-3 prefetches `prefetch` layers ahead)",
    "zero_optimization.contiguous_gradients": "ringzero's gradients always live in flat per-bucket buffers",
    "zero_optimization.reduce_scatter": "ringzero's ZeRO stages always reduce-scatter the gradients",
    "zero_optimization.allgather_partitions": "ringzero's ZeRO-1/2 always all-gather the updated shards",
    "zero_optimization.stage3_prefetch_bucket_size": "ringzero's ZeRO-3 prefetches whole layers (one bucket "
                                                     "each; set `prefetch`), not a number of elements",
    "zero_optimization.stage3_param_persistence_threshold": "ringzero's ZeRO-3 shards every layer, small ones "
                                                            "too (only the embeddings and final norm stay "
                                                            "gathered through a micro-batch)",
    "zero_optimization.stage3_max_live_parameters": _STAGE3_CACHE,
    "zero_optimization.stage3_max_reuse_distance": _STAGE3_CACHE,
    "zero_optimization.stage3_gather_16bit_weights_on_model_save": "ringzero's checkpoints are sharded; "
                                                                   "`ringzero checkpoint consolidate` writes "
                                                                   "the whole weights",
    "zero_optimization.stage3_gather_fp16_weights_on_model_save": "ringzero's checkpoints are sharded; "
                                                                  "`ringzero checkpoint consolidate` writes "
                                                                  "the whole weights",
    "zero_optimization.round_robin_gradients": "it orders DeepSpeed's offload copies; ringzero's are per bucket",
    "zero_optimization.sub_group_size": "it tiles DeepSpeed's optimizer step; ringzero's offloaded Adam "
                                        "streams its shard in buffer_count buffers",
    "zero_optimization.elastic_checkpoint": "ringzero's checkpoints load in any layout",
    "zero_optimization.load_from_fp32_weights": "ringzero's checkpoints hold the fp32 masters and load them",
    "zero_optimization.ignore_unused_parameters": "ringzero's GPT uses every parameter",
    "zero_optimization.legacy_stage1": "ringzero has one ZeRO-1",
    "zero_optimization.memory_efficient_linear": "ringzero's linear layers are torch's",
    "zero_optimization.zero_quantized_nontrainable_weights": "ringzero's GPT has no frozen weights",
    "zero_optimization.use_multi_rank_bucket_allreduce": "ringzero's buckets are reduced by ringzero.comm",
    "zero_optimization.use_all_reduce_for_fetch_params": "ringzero's ZeRO-3 gathers with an all-gather",
    "zero_optimization.log_trace_cache_warnings": "ringzero's ZeRO-3 keeps no trace cache",
    "zero_optimization.stage3_module_granularity_threshold": "ringzero's ZeRO-3 buckets are the model's layers",
    "zero_optimization.module_granularity_threshold": "ringzero's ZeRO-3 buckets are the model's layers",
    "zero_optimization.pipeline_loading_checkpoint": "ringzero loads checkpoints by its own reader",
    "zero_optimization.override_module_apply": "ringzero's ZeRO-3 hooks forward and backward only",
    "zero_optimization.offload_optimizer.fast_init": "ringzero creates its swap files once, at the start",
    "zero_optimization.offload_optimizer.pipeline_read": _SWAP,
    "zero_optimization.offload_optimizer.pipeline_write": _SWAP,
    "zero_optimization.offload_optimizer.pipeline": _SWAP,
    "zero_optimization.offload_optimizer.ratio": "ringzero offloads the whole optimizer shard (ratio 1)",
    "zero_optimization.offload_param.buffer_size": "ringzero sizes its weight swap buffers per layer",
    "zero_optimization.offload_param.max_in_cpu": "ringzero keeps no NVMe-offloaded weights in host memory",
    "fp16.auto_cast": "ringzero's model runs wholly in fp16 and takes token ids: there are no inputs to cast",
    "bf16.immediate_grad_update": "ringzero updates after the step's gradients are reduced",
    "optimizer.params.torch_adam": "ringzero's Adam is torch's fused AdamW kernel",
}
"""Key -> why it has no effect here (one warning line each)."""

QUIET_WHEN_OFF = {"wall_clock_breakdown", "memory_breakdown", "flops_profiler", "tensorboard", "wandb",
                  "csv_monitor", "comet", "comms_logger", "dump_state", "zero_allow_untested_optimizer",
                  "zero_force_ds_cpu_optimizer", "autotuning", "compile", "prescale_gradients", "sparse_gradients",
                  "eigenvalue", "fp16.auto_cast"}
"""TUNING keys that, off (false, or a section with enabled false), ask DeepSpeed for nothing: no line."""

REFUSED: dict[str, str] = {
    "amp": "ringzero has no Apex AMP; use fp16 or bf16 (16-bit weights, fp32 masters)",
    "torch_autocast": "autocast keeps fp32 weights; ringzero casts the model: use bf16 or fp16",
    "elasticity": "ringzero does not choose the batch from the world size; set train_batch_size",
    "sparse_attention": "ringzero's GPT has dense causal attention",
    "compression_training": "ringzero does not compress the model while training",
    "curriculum_learning": "ringzero feeds fixed-length sequences in a fixed order",
    "data_efficiency": "ringzero feeds fixed-length sequences in a fixed order",
    "progressive_layer_drop": "ringzero runs every layer at every step",
    "quantize_training": "ringzero trains unquantized weights (ZeRO++ quantizes only what is sent)",
    "hybrid_engine": "ringzero has no inference engine",
    "weight_quantization": "ringzero trains unquantized weights (ZeRO++ quantizes only what is sent)",
    "zero_optimization.cpu_offload": "DeepSpeed's deprecated spelling: write offload_optimizer: {device: cpu}",
    "zero_optimization.cpu_offload_params": "DeepSpeed's deprecated spelling: write offload_param: {device: cpu}",
    "zero_optimization.cpu_offload_use_pin_memory": "DeepSpeed's deprecated spelling: write "
                                                    "offload_optimizer: {pin_memory: ...}",
    "zero_optimization.mics_shard_size": "ringzero shards over all the data-parallel ranks (no MiCS)",
    "zero_optimization.mics_hierarchical_params_gather": "ringzero has no MiCS",
    "fp16.fp16_master_weights_and_grads": "ringzero keeps fp32 master weights and gradients in the optimizer",
    "bf16.bf16_master_weights_and_grads": "ringzero keeps fp32 master weights and gradients in the optimizer",
    "optimizer.params.amsgrad": "ringzero's Adam has no AMSGrad",
    "optimizer.params.max_grad_norm": "DeepSpeed refuses it as well: clip with gradient_clipping",
}
"""Key -> what ringzero lacks (refused when on; quiet when off)."""

OFF_VALUES = {"zero_optimization.mics_shard_size": -1}
"""REFUSED keys whose off value is not false (DeepSpeed's -1: no MiCS)."""


def path(section: str, key: str) -> str:
    return f"{section}.{key}" if section else key


def known(section: str) -> set[str]:
    """Every key ringzero knows in `section` ("" for the top level)."""
    prefix = f"{section}." if section else ""
    others = [k[len(prefix):] for k in (*TUNING, *REFUSED) if k.startswith(prefix)]
    return MAPPED.get(section, set()) | {k for k in others if "." not in k}


def is_off(key: str, value) -> bool:
    """Whether `value` of `key` asks for nothing (false, null, a section with enabled false)."""
    if isinstance(value, dict):
        return value.get("enabled") is False
    return value is None or value is False or (key in OFF_VALUES and value == OFF_VALUES[key])


def unknown(section: str, key: str) -> str:
    """The one line refusing `key` of `section`, with the closest known key if there is one."""
    where = f"{section} key" if section else "DeepSpeed config key"
    close = difflib.get_close_matches(key, sorted(known(section)), n=1)
    if close:
        return f"unknown {where} {key!r}; did you mean {close[0]}?"
    choices = sorted(known(section))
    listed = ", ".join(choices) if len(choices) <= 12 else "the keys listed in docs/deepspeed.md"
    return f"unknown {where} {key!r}; known: {listed}"
