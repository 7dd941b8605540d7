"""The figures of one run folder, drawn by mech.py after its analysis: mechanism.png (the Attrib
table as heat maps) and dynamics.png (the mechanism while the model trains). Drawing only: what
they show is computed in mech.py (section 6), and each function hands its figure to `save`."""
import matplotlib

matplotlib.use("Agg")  # files only, no window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def finish(fig, save) -> None:
    fig.tight_layout()
    save(fig)
    plt.close(fig)


def mechanism(rows: list, positions: tuple, title: str, save) -> None:
    """A heat map per site: layers x positions, the Attrib of patching there (Key corrupted)."""
    sites, layers = list(dict.fromkeys(r["site"] for r in rows)), sorted({r["layer"] for r in rows})
    fig, axes = plt.subplots(1, len(sites), figsize=(2.6 * len(sites), 0.6 * len(layers) + 1.6),
                             squeeze=False)
    for ax, site in zip(axes[0], sites):
        grid = np.full((len(layers), len(positions)), np.nan)
        for r in (r for r in rows if r["corrupted"] == "key" and r["site"] == site):
            grid[r["layer"], positions.index(r["position"])] = r["attrib"]
        ax.imshow(grid, vmin=-0.2, vmax=1.2, cmap="viridis", aspect="auto")
        for (y, x), v in np.ndenumerate(grid):
            if not np.isnan(v):
                ax.text(x, y, f"{v:.2f}", ha="center", va="center", fontsize=7,
                        color="w" if v < 0.6 else "k")
        ax.set_title(site, fontsize=9)
        ax.set_xticks(range(len(positions)), ["@" + p for p in positions], rotation=60, fontsize=7)
        ax.set_yticks(range(len(layers)), [f"layer {l}" for l in layers], fontsize=7)
    fig.suptitle(title + "\nAttrib: share of p(answer) restored by patching the clean activation "
                 "(Key corrupted)", fontsize=9)
    finish(fig, save)


def dynamics(points: list, series: dict, when: dict, name: str | None, min_effect: float,
             title: str, save) -> None:
    """Above, test accuracy and loss; below, on the same steps, the watched Attribs (series: label
    -> values, NaN where the Key does not matter). Dotted lines: when the mechanism forms (red,
    the verdict's Attrib `name` passes 0.5) and when accuracy rises (black; mech.moments)."""
    steps = [p["step"] for p in points]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(8, 6))
    top.plot(steps, [p["accuracy"] for p in points], "k-")
    top.set(ylabel="test accuracy (black)", ylim=(-0.03, 1.03))
    loss = top.twinx()
    loss.plot(steps, [p["test_loss"] for p in points], color="grey", ls="--")
    loss.set_ylabel("test loss (grey, dashed)")
    for i, (label, ys) in enumerate(series.items()):
        chosen = name is not None and label.endswith(f" @{name}")
        bottom.plot(steps, ys, "-" if " @" in label else ":", color=f"C{i}", label=label,
                    lw=2.5 if chosen else 1.2)
    for ax in (top, bottom):
        for step, color in ((when["mechanism"], "red"), (when["accuracy"], "k")):
            if step is not None:
                ax.axvline(step, color=color, ls=":", lw=1.2)
    bottom.set(xlabel="training step", ylabel="Attrib (Key corrupted)", ylim=(-0.3, 1.3))
    bottom.legend(fontsize=7, ncol=2, loc="center right")
    formed = (f"@{name.capitalize()} passes 0.5 at step {when['mechanism']} (red dotted)"
              if when["mechanism"] else "no mechanism formed (the verdict names no position)")
    fig.suptitle(f"{title}: the mechanism while it trains\n{formed}; accuracy passes halfway to "
                 f"its final at step {when['accuracy']} (black dotted)\nAttribs drawn where the Key "
                 f"matters (p_clean - p_corrupted >= {min_effect})", fontsize=8)
    finish(fig, save)
