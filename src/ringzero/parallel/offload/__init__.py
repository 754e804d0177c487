"""Offload (ZeRO-Offload, ZeRO-Infinity): the optimizer's states in host memory or on NVMe
(`optimizer`: start there), ZeRO-3's weight shards off the device (`params`' store, and `shards`, the
shard store ZeRO-3 composes), and the swap file's pipelined reads and writes (`nvme_swap`)."""
