"""Tensor and sequence parallelism (Megatron-LM): `tensor_parallel.apply_tensor_parallel` splits a
built model (start there); `ops` holds the conjugate collectives (f, g and the sequence-parallel
gather/scatter), `vocab` the vocabulary-parallel embedding, head and loss, `grads` how each kind of
parameter's gradient is completed over the tp group, `rng` the dropout RNG tracker."""
