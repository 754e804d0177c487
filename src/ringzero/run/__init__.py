"""What a run is, before any rank starts and without torch: the training configuration
(`config.TrainConfig`, in one section per option module, each validated as it is built:
`model_options`, `training_options`, `optim_options` with `precision_options`' loss scaler,
`parallel_options`, `zero_options`, `ps_options`, `checkpoint_options`, `fault_options`), the shapes
ringzero's GPT takes (`gpt_shape`), a DeepSpeed JSON configuration read into one (`deepspeed`), and
the record a rank returns (`result.RankResult`). Start at `config`."""
