"""The same schedules ringzero runs, played on a modelled cluster of thousands of GPUs.

- `topology`: GPUs in nodes on an NVLink/NVSwitch domain, NICs (rail-optimised or shared), leaf
  switches and an oversubscribed spine; the DGX presets; every link and its route;
- `fairshare`: max-min fair rates of flows sharing links (progressive filling);
- `fluid`: one step of concurrent flows played to its end as flows finish and the rest speed up;
- `collective`: a collective's schedule (`plan.comm.schedule`) played step by step, with link
  loads: the nccl-tests table of `ringzero simulate collective`.

Depends on `plan` alone (and numpy): no torch, no ranks.
"""
