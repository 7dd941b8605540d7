"""The pictures of one run folder, drawn from its metrics.json: mechanism.png (the Attrib table as
heat maps) and dynamics.png (the mechanism while the model trains, with the moments it forms and
the accuracy rises). The Attribs are computed in mech.py (section 6); each drawing function hands
its figure to `save`. mech.py draws nothing itself (it needs no matplotlib), so a picture can be
drawn, or drawn again, at any time after a run:
    python figures/plots.py RUN_DIR [RUN_DIR ...]"""
import argparse
import io
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def watched(point: dict, name: str) -> float:
    """A curve point's watched Attrib: a main position ("value") or a cell's name."""
    a = point["attrib"]
    return a["main"][name] if name in a["main"] else a["cells"][name]


def dynamics_series(points: list, main: str, min_effect: float) -> dict:
    """{label: the watched Attrib at each point}, NaN where the Key does not matter (its effect is
    below min_effect: that Attrib is noise)."""
    a = points[0]["attrib"]
    return {f"{main} @{n}" if n in a["main"] else n:
            [watched(p, n) if p["attrib"]["effect"] >= min_effect else math.nan
             for p in points] for n in [*a["main"], *a["cells"]]}


def moments(curve: list, name: str | None, min_effect: float) -> dict:
    """The steps where the mechanism forms (the first evaluation where the Key matters and the
    watched Attrib `name`, the verdict's, reaches 0.5) and where accuracy rises (halfway from its
    first evaluation to a higher last one; ATR starts near a copy baseline); None if never."""
    points = [p for p in curve if "attrib" in p]
    formed = (p["step"] for p in points if name and p["attrib"]["effect"] >= min_effect
              and watched(p, name) >= 0.5)
    half = (points[0]["accuracy"] + points[-1]["accuracy"]) / 2
    rises = (p["step"] for p in points if p["accuracy"] >= half > points[0]["accuracy"])
    return dict(mechanism=next(formed, None), accuracy=next(rises, None))


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
        heat_map(ax, grid, positions, [f"layer {l}" for l in layers])
        ax.set_title(site, fontsize=9)
    fig.suptitle(title + "\nAttrib: share of p(answer) restored by patching the clean activation "
                 "(Key corrupted)", fontsize=9)
    finish(fig, save)


def heat_map(ax, grid: np.ndarray, positions: tuple, rows: list) -> None:
    """Attribs (rows x positions) in colour, each cell's value written (none where NaN)."""
    ax.imshow(grid, vmin=-0.2, vmax=1.2, cmap="viridis", aspect="auto")
    for (y, x), v in np.ndenumerate(grid):
        if not np.isnan(v):
            ax.text(x, y, f"{v:.2f}", ha="center", va="center", fontsize=7,
                    color="w" if v < 0.6 else "k")
    ax.set_xticks(range(len(positions)), ["@" + p for p in positions], rotation=60, fontsize=7)
    ax.set_yticks(range(len(rows)), rows, fontsize=7)


def dynamics(points: list, series: dict, when: dict, name: str | None, min_effect: float,
             title: str, save) -> None:
    """Above, test accuracy and loss; below, on the same steps, the watched Attribs (series: label
    -> values, NaN where the Key does not matter). Dotted lines: when the mechanism forms (red,
    the verdict's Attrib `name` reaches 0.5) and when accuracy rises (black; moments)."""
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
    formed = (f"@{name.capitalize()} reaches 0.5 at step {when['mechanism']} (red dotted)"
              if when["mechanism"] else "no mechanism formed (the verdict names no position)")
    rises = (f"accuracy reaches halfway to its final at step {when['accuracy']} (black dotted)"
             if when["accuracy"] is not None else "accuracy never rises above its first value")
    fig.suptitle(f"{title}: the mechanism while it trains\n{formed}; {rises}\nAttribs drawn where "
                 f"the Key matters (p_clean - p_corrupted >= {min_effect})", fontsize=8)
    finish(fig, save)


def run_figures(rows: list, curve: list, name: str | None, main: str, min_effect: float,
                positions: tuple, title: str) -> list:
    """[(file name, PNG bytes)] of a run: mechanism.png, and dynamics.png if it was watched while
    it trained. name: the verdict's position (None: no mechanism); main: the verdict's site."""
    pngs = []

    def save(file):
        def to_bytes(fig):
            buffer = io.BytesIO()
            fig.savefig(buffer, dpi=120, format="png")
            pngs.append((file, buffer.getvalue()))
        return to_bytes

    mechanism(rows, positions, title, save("mechanism.png"))
    points = [p for p in curve if "attrib" in p]  # none with --no-dynamics
    # only a run watched to its end: one resumed with --no-dynamics has its first points alone,
    # which would stand for the whole run under the final accuracy of its title
    if points and points[-1]["step"] == curve[-1]["step"]:
        dynamics(points, dynamics_series(points, main, min_effect),
                 moments(points, name, min_effect), name, min_effect, title, save("dynamics.png"))
    return pngs


def write_file(path: str, data) -> None:
    """Write data (bytes or str) whole: to a temporary name, then renamed (as mech.save does)."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def in_one_line(e: Exception) -> str:
    """An error as a one-line error message quotes it: its type and its message's first line."""
    return ": ".join([type(e).__name__, *str(e).strip().splitlines()[:1]])


def draw_run(out: str) -> list:
    """Draw the pictures of the analysed run in `out` next to its metrics.json -> their paths."""
    import mech  # the lab imports the lesson: its verdict rule and sites name what is drawn
    with mech.reading(os.path.join(out, "config.json")), \
            open(os.path.join(out, "config.json")) as f:
        fields = json.load(f)
    with mech.reading(os.path.join(out, "metrics.json")), \
            open(os.path.join(out, "metrics.json")) as f:
        metrics = json.load(f)
        analysis, curve = metrics["interventions"], metrics["curve"]
    task, n_layer = fields.get("task", "ar"), fields.get("n_layer", 2)
    learned = mech.key_effect(analysis["rows"]) >= mech.VERDICT_MIN_EFFECT
    name = mech.dominant(analysis["main"]) if learned else None  # the verdict's position, if any
    title = (f"{fields.get('arch')} on {task}, d={fields.get('d_model')}, "
             f"test accuracy {metrics['accuracy']:.3f}")
    paths = []
    for file, png in run_figures(analysis["rows"], curve, name, "%s[%d]" % mech.verdict_site(n_layer),
                                 mech.PAPER_FILTER[task], mech.POSITIONS, title):
        write_file(os.path.join(out, file), png)
        paths.append(os.path.join(out, file))
    return paths


def main(argv=None) -> None:
    """Draw the pictures of each run folder given, printing their paths; a run that cannot be
    drawn ends the command in one line that names it (exit code 1)."""
    parser = argparse.ArgumentParser(prog="plots.py", description="Draw mechanism.png and "
                                     "dynamics.png of analysed mech.py runs.")
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR")
    for run in parser.parse_args(argv).runs:
        try:
            print("\n".join(draw_run(run)))
        except Exception as e:  # one generic catch: whatever in its files cannot be read or drawn
            parser.exit(1, f"plots.py: error: {run} cannot be drawn ({in_one_line(e)})\n")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
