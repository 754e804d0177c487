"""Formatting for `ringzero bench comm`: the nccl-tests table, the fitted calibration, the plot."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from ringzero.plan.comm.network import FEATURES


def make_console() -> Console:
    """A console that prints whole table rows when the output is a pipe or a log file."""
    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, 110)
    return console


EMULATION_CAPTION = ("x-node B: the most bytes one rank sent to other nodes in one call (traffic "
                     "meter). emu (µs): α-β prediction of the time the emulated links add, "
                     "Σ over steps of the slowest rank's inter-node messages (plan.links); the "
                     "machine's own time comes on top; '-': algorithm not modelled.")


def print_table(rows: list[dict], console: Console | None = None) -> None:
    """One table per (collective, world), rows by size then algorithm, as nccl-tests prints; under
    the link emulator two more columns, the cross-node bytes and the predicted emulated time."""
    console = console or make_console()
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["collective"], r["world"]), []).append(r)
    emulated = any("emulated_us" in r for r in rows)
    extra = ("x-node B", "emu (µs)") if emulated else ()
    for (collective, world), rs in groups.items():
        t = Table(title=f"{collective} on {world} ranks (bandwidths in GB/s)", title_justify="left",
                  box=box.SIMPLE_HEAD, caption=EMULATION_CAPTION if emulated else None,
                  caption_justify="left")
        for name in ("size (B)", "count", "type", "algorithm", "transport", "time (µs)", "algbw", "busbw",
                     "#wrong", *extra):
            t.add_column(name, justify="left" if name in ("type", "algorithm", "transport") else "right",
                         no_wrap=True)
        for r in sorted(rs, key=lambda r: r["size"]):
            cells = [str(r["size"]), str(r["count"]), r["dtype"], r["algorithm"], r.get("transport", "-"),
                     f"{r['time_us']:.1f}", f"{r['algbw']:.3f}", f"{r['busbw']:.3f}", str(r["wrong"])]
            if emulated:
                predicted = r.get("emulated_us")
                cells += [str(r.get("cross_node_bytes", "-")), "-" if predicted is None else f"{predicted:.1f}"]
            t.add_row(*cells, style="red" if r["wrong"] else None)
        console.print(t)


def describe_model(model) -> str:
    """α, β, γ in readable units, then the other coefficients that are not zero."""
    bw = f" ({1 / model.beta / 1e9:.2f} GB/s)" if model.beta > 0 else ""
    text = (f"α = {model.alpha * 1e6:.2f} µs/round, β = {model.beta * 1e9:.4f} ns/B{bw}, "
            f"γ = {model.gamma * 1e9:.4f} ns/B")
    units = {"per_call": (1e6, "µs"), "per_message": (1e6, "µs/msg"), "host_message": (1e6, "µs/msg"),
             "host_beta": (1e9, "ns/B"), "host_gamma": (1e9, "ns/B")}
    extra = [f"{name} = {v * units[name][0]:.4g} {units[name][1]}"
             for name, v in zip(FEATURES, model.coefficients()) if name in units and v > 0]
    return text + (", " + ", ".join(extra) if extra else "")


def print_calibration(cal, path, console: Console | None = None) -> None:
    console = console or make_console()
    err, shared = cal.error, cal.error.get("shared", {})
    console.print(f"[bold]calibration[/bold] written to {path}")
    console.print(f"  shared model: {describe_model(cal.model)}")
    if shared:
        console.print(f"    fit error of the shared model: median {shared['median']:.1%}, "
                      f"max {shared['max']:.1%}")
    for key, model in sorted(cal.per_algorithm.items()):
        console.print(f"  {key}: {describe_model(model)}")
    for key, coefs in sorted(cal.overlap.items()):
        console.print(f"  {key}, bytes overlapped by the pipeline: "
                      + ", ".join(f"{k} = {v * 1e9:.4f} ns/B" for k, v in coefs.items()))
    if err:
        console.print(f"  fit error (per-algorithm models, {err['rows']} rows): median "
                      f"{err['median']:.1%}, max {err['max']:.1%}")


def plot(rows: list[dict], path: str) -> None:
    """busbw vs size, one panel per collective, one line per (algorithm, world)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    collectives = list(dict.fromkeys(r["collective"] for r in rows))
    cols = min(2, len(collectives))
    nrows = -(-len(collectives) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(6.5 * cols, 4 * nrows), squeeze=False)
    for ax, collective in zip(axes.flat, collectives):
        lines: dict[tuple[str, int], list[dict]] = {}
        for r in rows:
            if r["collective"] == collective:
                lines.setdefault((r["algorithm"], r["world"]), []).append(r)
        for (alg, world), rs in lines.items():
            rs = sorted(rs, key=lambda r: r["size"])
            ax.plot([r["size"] for r in rs], [r["busbw"] for r in rs], marker="o",
                    label=f"{alg} ({world} ranks)", linestyle="--" if alg == "torch" else "-")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(collective)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(collectives):]:
        ax.axis("off")
    fig.tight_layout()
    from ringzero.outputs import plot_format, write_with
    fmt = plot_format(path, "--plot")
    write_with(path, lambda f: fig.savefig(f, format=fmt, dpi=110), binary=True)
    plt.close(fig)
