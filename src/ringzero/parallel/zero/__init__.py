"""ZeRO (Rajbhandari et al. 2020): stages 1 and 2 over flat buckets (`zero12`), and stage 3 (`zero3`:
start there), one class composed of policies: where the weight shards wait (`shards`; offloaded ones
in `parallel.offload.shards`), how they are gathered (`gather`: plain, ZeRO++'s qwZ and hpZ), when
each layer is (`layer_gathers`), and how gradients are reduced (reduce-scatter, or ZeRO++'s qgZ in
`qgz`); `zeropp` picks ZeRO++'s policies."""
