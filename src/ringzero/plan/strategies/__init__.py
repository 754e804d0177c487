"""What each parallel strategy holds and sends: ZeRO's table of what is sharded (`sharding`: start
there), model-state memory (`memory`), bytes on the wire per strategy (`traffic`, and `compare`
beside the textbook formulas), tensor parallelism's collectives (`tensor_parallel`), ZeRO++
(`zeropp`, `quantization`), offload (`offload`, `swap_pipeline`) and the parameter server
(`param_server`, `ps_plan`)."""
