"""ZeRO (Rajbhandari et al. 2020): stages 1 and 2 over flat buckets (`zero12`), stage 3 with its
layer-wise all-gathers and prefetch (`zero3`), and ZeRO++'s quantised weights, hierarchical
partitions and quantised gradients on top of stage 3 (`zeropp`). Start at `zero3`."""
