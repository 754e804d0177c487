"""`make gpu-check` (`python -m ringzero.gpu_check`): the paths that only a CUDA machine can run.

In order, each part a subprocess with its own timeout (a failing part does not stop the others):
the CUDA-marked tests (`pytest -m cuda`); a 2-rank `torchrun ... ringzero.cli train` per strategy
(dp, zero3, tp, pp) with its predicted-vs-measured twins; `ringzero bench comm --compare`; and
ringzero's collectives against NCCL's own on CUDA tensors (`gpu_check.nccl_comm`). One JSON summary
(`--out`) holds each part's status, exit code, numbers and the tail of any failure; it is rewritten
after every part, so a check stopped half-way still says how far it got. On a machine without CUDA
it says so in one line, runs nothing, writes nothing and exits 0. See docs/gpu.md.
"""
