"""What the planner predicts for a run, set beside what the run measured, without torch.

`predict` turns a `TrainConfig` into the planner's counts (bytes per collective, states held,
activations); `step` prices one step's phases from the in-run probes' rates (`rates`), with
`pipeline`, `links`, `offload` and `straggler` for those features; `report` builds the twin table
(`Twin`: predicted, measured, error) and the JSON, `zero`, `ps` and `wait` the feature tables,
`footprint` the memory check before ranks start, `pipeline_plot` the pipeline timeline. Start at
`report.twins`."""
