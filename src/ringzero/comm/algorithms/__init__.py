"""The collective algorithms, one file per technique, all written against `ringzero.comm.protocol.Comm`.

Every function works on flat 1-D buffers and `bounds` (n+1 chunk offsets, see
`ringzero.plan.comm.chunks`); `ringzero.comm.api` turns the `torch.distributed`-style arguments into that
form and back.
"""
