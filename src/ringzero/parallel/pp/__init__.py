"""Pipeline parallelism: `pipeline.apply_pipeline` cuts a model into stages and runs a schedule's
action lists over point-to-point messages (start there); `sequential` holds a stage's chunks as
one sequence of layers."""
