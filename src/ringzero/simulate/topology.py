"""A cluster as links: GPUs per node on an NVSwitch, NICs to leaf switches, leaves to a spine.

Every link carries one direction at its capacity in bytes/s. Its ids, for G GPUs, N nodes, K NICs
per node and L leaves:

- [0, G): GPU g's NVLink into the node's NVSwitch; [G, 2G): the NVSwitch to GPU g (an NVSwitch
  domain is non-blocking: a GPU's ports bound it, `nvlink_bw` per direction);
- [2G, 2G + N·K): NIC k of node j sending; then N·K more receiving (`nic_bw` each);
- then L leaf uplinks to the spine and L downlinks from it, each `nodes_per_leaf · nic_bw /
  oversubscription` (the leaf's ports up are fewer than its ports down by that ratio, and ECMP over
  them is taken as one pipe: the fluid view of a fat tree's uplinks).

Routes. Inside a node: NVLink up, NVLink down. Between nodes: GPU g uses NIC (g mod K) of its node
(with K = 8 every GPU has its own, as DGX systems do; K = 1 shares one); rail-optimised, NIC k of
every node is on rail k, a leaf serves one rail of `nodes_per_leaf` nodes, so a message between
different rails or different leaves crosses the spine. With `pxn` (NCCL's PXN, "PCI x NVLink",
NCCL 2.12: `NCCL_PXN_DISABLE=0`) a message between rails first goes over NVLink to the GPU of its
own node on the destination's rail and leaves by that GPU's NIC, so it stays on one rail (and off
the spine when both nodes share a leaf group), at the price of an NVLink hop. The host side of a
NIC (PCIe) is not a link: it is faster than the NIC on these systems.

Latency: `nvlink_latency` per message inside a node, `nic_latency` per message between nodes plus
`switch_latency` for each spine crossing (Hockney's α per message; the planner's
`intra_alpha`/`inter_alpha`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ringzero.plan.hardware import HARDWARE, Hardware


@dataclass(frozen=True, kw_only=True)
class Topology:
    name: str = "custom"
    gpus: int
    gpus_per_node: int = 8
    nvlink_bw: float
    """Bytes/s per GPU per direction into the NVSwitch."""
    nvlink_latency: float
    nics_per_node: int = 8
    nic_bw: float
    """Bytes/s per NIC per direction."""
    nic_latency: float
    rail_optimized: bool = True
    nodes_per_leaf: int = 32
    oversubscription: float = 1.0
    """Leaf ports down / ports up (1: a non-blocking fat tree)."""
    switch_latency: float = 0.0
    """Seconds per message added by each spine crossing."""
    pxn: bool = False
    """Route a message between rails through the source node's GPU on the destination's rail
    (NCCL's PXN; rail-optimised fabrics only)."""
    degrade: tuple[tuple[str, float], ...] = ()
    """(link, factor): links whose capacity is divided by factor (>= 1): "gpuG" (GPU G's NVLink,
    both directions), "nicJ.K" (NIC K of node J), "leafL" (leaf L's uplink and downlink)."""

    def __post_init__(self) -> None:
        for k in ("nvlink_bw", "nic_bw", "oversubscription"):
            if not getattr(self, k) > 0:
                raise ValueError(f"{k.replace('_', '-')} must be > 0, got {getattr(self, k)}")
        for k in ("nvlink_latency", "nic_latency", "switch_latency"):
            if not getattr(self, k) >= 0:
                raise ValueError(f"{k.replace('_', '-')} must be >= 0, got {getattr(self, k)}")
        for k in ("gpus", "gpus_per_node", "nics_per_node", "nodes_per_leaf"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k.replace('_', '-')} must be >= 1, got {getattr(self, k)}")
        if self.gpus > self.gpus_per_node and self.gpus % self.gpus_per_node:
            raise ValueError(f"--gpus {self.gpus} is not a multiple of the {self.gpus_per_node} GPUs per node")
        if self.nics_per_node > self.gpus_per_node:
            raise ValueError(f"nics-per-node {self.nics_per_node} exceeds the {self.gpus_per_node} GPUs per node")
        if self.pxn and not self.rail_optimized:
            raise ValueError("--pxn moves a message onto its destination's rail: it needs rail-optimised NICs, "
                             "not --shared-nic")
        for link, factor in self.degrade:
            self.link_ids(link)
            if not factor >= 1:
                raise ValueError(f"--degrade {link}:{factor}: the factor must be >= 1 (a slower link)")

    @property
    def nodes(self) -> int:
        return -(-self.gpus // self.gpus_per_node)

    @property
    def leaves(self) -> int:
        """Leaf switches: one per rail per `nodes_per_leaf` nodes (rail-optimised), else per group."""
        groups = -(-self.nodes // self.nodes_per_leaf)
        return groups * (self.nics_per_node if self.rail_optimized else 1)

    def capacities(self) -> np.ndarray:
        g, nk, lv = self.gpus, self.nodes * self.nics_per_node, self.leaves
        ports = self.nodes_per_leaf * (1 if self.rail_optimized else self.nics_per_node)
        up = min(ports, self.nodes * (1 if self.rail_optimized else self.nics_per_node)) * self.nic_bw
        cap = np.concatenate([np.full(2 * g, self.nvlink_bw), np.full(2 * nk, self.nic_bw),
                              np.full(2 * lv, up / self.oversubscription)])
        for link, factor in self.degrade:
            cap[self.link_ids(link)] /= factor
        return cap

    def link_ids(self, spec: str) -> list[int]:
        """The two directions of link `spec` ("gpu5", "nic3.2", "leaf4"), or a ValueError naming the
        ones that exist."""
        g, k, nk, lv = self.gpus, self.nics_per_node, self.nodes * self.nics_per_node, self.leaves
        allowed = (f"gpu0..gpu{g - 1}, nic0.0..nic{self.nodes - 1}.{k - 1}"
                   + (f", leaf0..leaf{lv - 1}" if self.nodes > 1 else ""))
        try:
            if spec.startswith("gpu") and 0 <= int(spec[3:]) < g:
                return [int(spec[3:]), g + int(spec[3:])]
            if spec.startswith("nic"):
                node, nic = (int(x) for x in spec[3:].split("."))
                if 0 <= node < self.nodes and 0 <= nic < k:
                    return [2 * g + node * k + nic, 2 * g + nk + node * k + nic]
            if spec.startswith("leaf") and self.nodes > 1 and 0 <= int(spec[4:]) < lv:
                return [2 * g + 2 * nk + int(spec[4:]), 2 * g + 2 * nk + lv + int(spec[4:])]
        except ValueError:
            pass
        raise ValueError(f"no link {spec!r} on {g} GPUs; allowed: {allowed}")

    def link_name(self, i: int) -> str:
        """Link i as "gpu5 nvlink up", "nic3.2 tx", "leaf4 down": its first word is what `link_ids`
        (and --degrade) take."""
        g, nk, lv = self.gpus, self.nodes * self.nics_per_node, self.leaves
        k = self.nics_per_node
        names = [(g, lambda j: f"gpu{j} nvlink up"), (g, lambda j: f"gpu{j} nvlink down"),
                 (nk, lambda j: f"nic{j // k}.{j % k} tx"), (nk, lambda j: f"nic{j // k}.{j % k} rx"),
                 (lv, lambda j: f"leaf{j} up"), (lv, lambda j: f"leaf{j} down")]
        for size, fmt in names:
            if i < size:
                return fmt(i)
            i -= size
        raise IndexError(i)

    def routes(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(links (F, 6) with -1 for none, latency (F,)) of flows from GPUs `src` to GPUs `dst`:
        NVLink up and down inside a node; between nodes [PXN's NVLink up and down to the relay,]
        the sending NIC, [the leaf's uplink and the far leaf's downlink,] the receiving NIC."""
        g, per, k = self.gpus, self.gpus_per_node, self.nics_per_node
        nk, lv = self.nodes * k, self.leaves
        node_s, node_d = src // per, dst // per
        rail_s, rail_d = (src % per) % k, (dst % per) % k
        inside = node_s == node_d
        relay = ~inside & (rail_s != rail_d) if self.pxn else np.zeros(len(src), dtype=bool)
        via = node_s * per + rail_d                     # the source node's GPU on the destination's rail
        rail_s = np.where(relay, rail_d, rail_s)
        nic_s, nic_d = node_s * k + rail_s, node_d * k + rail_d
        groups_s, groups_d = node_s // self.nodes_per_leaf, node_d // self.nodes_per_leaf
        if self.rail_optimized:
            leaf_s, leaf_d = groups_s * k + rail_s, groups_d * k + rail_d
        else:
            leaf_s, leaf_d = groups_s, groups_d
        spine = leaf_s != leaf_d
        links = np.full((len(src), 6), -1, dtype=np.int64)
        links[:, 0] = np.where(inside, src, 2 * g + nic_s)
        links[:, 1] = np.where(inside, g + dst, 2 * g + nk + nic_d)
        cross = ~inside & spine
        links[cross, 2] = 2 * g + 2 * nk + leaf_s[cross]
        links[cross, 3] = 2 * g + 2 * nk + lv + leaf_d[cross]
        links[relay, 4] = src[relay]
        links[relay, 5] = g + via[relay]
        latency = np.where(inside, self.nvlink_latency,
                           self.nic_latency + np.where(spine & ~inside, self.switch_latency, 0.0)
                           + np.where(relay, self.nvlink_latency, 0.0))
        return links, latency


def _from(hw: Hardware, name: str) -> dict:
    return dict(name=name, gpus_per_node=hw.gpus_per_node, nvlink_bw=hw.intra_bw, nvlink_latency=hw.intra_alpha,
                nics_per_node=8, nic_bw=hw.inter_bw, nic_latency=hw.inter_alpha)


PRESETS = {
    # NVIDIA DGX A100 user guide: 8 A100 on NVSwitch (NVLink 3, 300 GB/s per direction per GPU) and
    # 8 x 200 Gb/s HDR InfiniBand (ConnectX-6) for compute, one per GPU: 25 GB/s each way.
    "dgx-a100": _from(HARDWARE["a100-80gb"], "dgx-a100"),
    # Azure ND A100 v4 (NVIDIA A100 80GB on NVSwitch, 8 x 200 Gb/s HDR InfiniBand, one per GPU) with
    # the NVLink figures NCCL reaches: fitted (`calibrate.fit`, the ring) to Azure's published
    # all_reduce_perf run at two sizes, 32 MiB (132.77 GB/s busbw) and 8 GiB (231.58 GB/s); the run is
    # `published.AZURE_ND_A100_V4`, and its other sizes check the fit.
    "nd-a100-v4": {**_from(HARDWARE["a100-80gb"], "nd-a100-v4"), "nvlink_bw": 232.26e9, "nvlink_latency": 13.53e-6},
    # NVIDIA DGX H100 user guide: 8 H100 SXM on NVSwitch (NVLink 4, 450 GB/s per direction per GPU),
    # 8 x 400 Gb/s NDR ConnectX-7, one per GPU: 50 GB/s each way.
    "dgx-h100": _from(HARDWARE["h100-sxm"], "dgx-h100"),
    # NVIDIA DGX H200: the same NVLink 4 and 8 x 400 Gb/s ConnectX-7 as DGX H100.
    "dgx-h200": _from(HARDWARE["h200"], "dgx-h200"),
}
"""Preset name -> Topology fields (all but `gpus`); the figures a planner preset also has are taken
from `plan.hardware` so the two cannot disagree."""


def preset_fields(name: str) -> dict:
    """The fields of preset `name` (all but `gpus`), or a one-line ValueError naming the presets."""
    if name not in PRESETS:
        raise ValueError(f"unknown topology {name!r}; allowed: {', '.join(PRESETS)}")
    return dict(PRESETS[name])


def preset(name: str, gpus: int, **overrides) -> Topology:
    """The preset `name` for `gpus` GPUs, with any field overridden (None values ignored)."""
    fields = {**preset_fields(name), **{k: v for k, v in overrides.items() if v is not None}}
    return Topology(gpus=gpus, **fields)


def linked(hw: Hardware, fields: dict) -> Hardware:
    """`hw` with the link figures of topology `fields` (`_from`'s inverse): the planner then prices
    the cluster the simulator plays, not the one `hw` came with."""
    return replace(hw, name=f"{hw.name} on {fields['name']}", gpus_per_node=fields["gpus_per_node"],
                   intra_bw=fields["nvlink_bw"], intra_alpha=fields["nvlink_latency"],
                   inter_bw=fields["nic_bw"], inter_alpha=fields["nic_latency"])


def with_gpus(topo: Topology, gpus: int) -> Topology:
    return replace(topo, gpus=gpus)
