"""What a run is, before any rank starts and without torch: the training configuration
(`config.TrainConfig`, validated at construction by its option modules: `zero_options`,
`precision_options`, `ps_options`, `checkpoint_options`, `fault_options`), the shapes ringzero's GPT
takes (`gpt_shape`), a DeepSpeed JSON configuration read into one (`deepspeed`), and the record a
rank returns (`result.RankResult`). Start at `config`."""
