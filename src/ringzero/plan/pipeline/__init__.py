"""Pipeline parallelism in the plan: each schedule's action lists, bubble and memory in flight
(`schedule`: GPipe, 1F1B, interleaved; start there) and how layers are cut into stages and chunks
(`layout`)."""
