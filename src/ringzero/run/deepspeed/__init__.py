"""A DeepSpeed `ds_config.json` read into a `TrainConfig`: `reader.from_deepspeed` (start there),
the keys it maps, accepts with a warning or refuses (`keys`), the sections' own readers
(`sections`: zero_optimization, fp16/bf16, offload) and the schedulers' warm-up (`schedule`)."""
