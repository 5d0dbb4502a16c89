"""Figures of a batch of runs (matplotlib, Agg backend: no display needed).

* :func:`plot_accuracy_curves`: test accuracy against round, one line per algorithm, the spread over
  seeds shaded (mean +- std); ``X+LAG`` is drawn dashed in ``X``'s colour, and a curve that another one
  holds point for point in short dashes over it, named in the legend (``FedPer (= FedLAG, n=2)``). A large
  grid becomes small multiples, one panel per algorithm with FedAvg and FedLAG as references.
* :func:`plot_conflict_heatmap`: FedLAG's per-layer conflict score over rounds, layers x rounds (the
  paper's Fig. 2b), with the layers chosen as personal marked.
* :func:`plot_client_groups`: each client's group for a personal layer over rounds (``--lag_share groups``),
  one distinct colour per group.
* :func:`plot_personal_frequency`: the fraction of rounds each layer was kept personal.
* :func:`plot_dlg_psnr`: ``-dlg``'s PSNR against round, one line per algorithm: how closely Deep Leakage
  from Gradients rebuilt clients' images from each attacked round's uploads.

Each function draws one figure, saves it when given a path and returns it (closed figures are still
inspectable), so tests can check axes, labels and data.
"""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import matplotlib
import matplotlib.colors
import matplotlib.patches

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
from mpl_toolkits.axes_grid1 import make_axes_locatable  # noqa: E402

from dataset.utils.atomic_io import atomic_path  # noqa: E402
from flcore.registry import LAG_SUFFIX, lag_base  # noqa: E402

# Curve = (rounds, mean, std, runs contributing to each round); accuracies as fractions in [0, 1].
Curve = Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
DPI = 130


def row_algorithm(name: str) -> str:
    """The algorithm of a table row's label: ``FedLAG (--lag_share groups)`` -> ``FedLAG``."""
    return name.split(" (", 1)[0]


def row_base(name: str) -> str:
    """A row's label with ``X+LAG`` read as ``X``: ``FedRep+LAG (-gr 5)`` -> ``FedRep (-gr 5)``, the row it pairs with."""
    algorithm, _, detail = name.partition(" (")
    return lag_base(algorithm) + (f" ({detail}" if detail else "")


def algorithm_styles(names: Sequence[str]) -> Dict[str, dict]:
    """A colour per base algorithm and settings (``X`` and ``X+LAG`` of one row's settings share it), ``X+LAG``
    dashed; FedLAG black and thicker (a second FedLAG row, of other settings, gets a colour of its own).

    Up to 10 bases use tab10; more use tab20's dark shades before its light ones, then repeat the
    colours with markers, so that no two lines look the same.
    """
    bases = list(dict.fromkeys(row_base(n) for n in names))
    black = next((b for b in bases if row_algorithm(b) == "FedLAG"), None)
    bases = [b for b in bases if b != black]
    if len(bases) <= 10:
        palette = [plt.get_cmap("tab10")(i) for i in range(10)]
    else:
        tab20 = plt.get_cmap("tab20")
        palette = [tab20(i) for i in range(0, 20, 2)] + [tab20(i) for i in range(1, 20, 2)]
    markers = ("", "o", "s", "^", "D")
    colours = {b: (palette[i % len(palette)], markers[(i // len(palette)) % len(markers)]) for i, b in enumerate(bases)}
    colours[black] = ("black", "")
    styles = {}
    for n in names:
        colour, marker = colours[row_base(n)]
        first_fedlag = row_base(n) == black and row_algorithm(n) == "FedLAG"
        styles[n] = {"color": colour, "linestyle": "--" if row_algorithm(n).endswith(LAG_SUFFIX) else "-",
                     "linewidth": 2.4 if first_fedlag else 1.5, "zorder": 3 if first_fedlag else 2}
        if marker:
            styles[n].update(marker=marker, markersize=3, markevery=0.1)
    return styles


def repeated_curves(curves: Dict[str, Curve]) -> Dict[str, str]:
    """``{name: other name}`` for each curve that another one holds point for point: the same mean accuracy at
    each of its rounds (FedPer's and FedLAG's when FedLAG kept the head personal every round; a run of
    ``-gr 1`` and the first rounds of one of ``-gr 100`` from the same seed). Drawn as it is, its line would lie
    hidden under the other one. Of two equal curves the later is named."""
    def within(inner: Curve, outer: Curve) -> bool:
        place = {int(r): i for i, r in enumerate(outer[0])}
        if not all(int(r) in place for r in inner[0]):
            return False
        return np.array_equal(inner[1], outer[1][[place[int(r)] for r in inner[0]]], equal_nan=True)

    names = list(curves)
    repeats = {}
    for i, name in enumerate(names):
        covering = (other for j, other in enumerate(names) if j != i and within(curves[name], curves[other])
                    and not (j > i and within(curves[other], curves[name])))
        same = next(covering, None)
        if same is not None:
            repeats[name] = same
    return repeats


# Characters a legend line holds before it is broken (row labels name settings, and can be long).
LEGEND_WRAP = 60
# A repeated curve is drawn over the one it repeats in short dashes, so that both colours show.
REPEAT_STYLE = {"linestyle": (0, (2, 2)), "zorder": 4}


def draw_accuracy_curves(ax, curves: Dict[str, Curve], styles: Optional[Dict[str, dict]] = None) -> Dict[str, str]:
    """Mean accuracy (%) per algorithm on ``ax``, shaded +- one std over the runs. A curve that another one
    holds (:func:`repeated_curves`) is drawn over it in short dashes and labelled ``X (= Y, n=...)``. Returns
    those repeats."""
    styles = styles or algorithm_styles(list(curves))
    repeats = repeated_curves(curves)
    shade = 0.18 if len(curves) <= 10 else 0.07  # many overlapping bands would hide the lines
    for name, (rounds, mean, std, count) in curves.items():
        style = {"zorder": 2, **styles[name], **(REPEAT_STYLE if name in repeats else {})}
        runs = int(np.max(count)) if len(count) else 0
        same = f"= {repeats[name]}, " if name in repeats else ""
        ax.plot(rounds, 100 * mean, label=textwrap.fill(f"{name} ({same}n={runs})", LEGEND_WRAP), **style)
        if runs > 1:
            ax.fill_between(rounds, 100 * (mean - std), 100 * (mean + std), color=style["color"], alpha=shade,
                            linewidth=0)
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("test accuracy (%)")
    ax.grid(True, alpha=0.3)
    return repeats


# Beyond this many algorithms (X and X+LAG counted once) one axes is unreadable: small multiples instead.
PANEL_LIMIT = 8
# Drawn in every small-multiple panel, so each method is read against them.
REFERENCES = ("FedAvg", "FedLAG")
REFERENCE_STYLES = {"FedAvg": {"color": "0.6", "linestyle": "-", "linewidth": 1.1},
                    "FedLAG": {"color": "black", "linestyle": "-", "linewidth": 1.3, "zorder": 3}}


def plot_accuracy_curves(curves: Dict[str, Curve], title: str, path: Optional[Path] = None) -> Figure:
    """One line per algorithm: mean test accuracy over seeds against round, +- std shaded.

    More than ``PANEL_LIMIT`` algorithms are drawn as small multiples (:func:`plot_accuracy_panels`).
    """
    if len({row_base(n) for n in curves if n not in REFERENCES}) > PANEL_LIMIT:
        return plot_accuracy_panels(curves, title, path)
    # Many lines, or labels that name settings, would cover the curves: the legend goes beside the axes.
    beside = len(curves) > 8 or max(map(len, curves)) > LEGEND_WRAP // 2
    fig, ax = plt.subplots(figsize=(11.5, 5.5) if beside else (8.5, 5.0))
    draw_accuracy_curves(ax, curves)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left" if beside else "best", bbox_to_anchor=(1.01, 1.0) if beside else None)
    fig.tight_layout()
    return _save(fig, path)


def plot_accuracy_panels(curves: Dict[str, Curve], title: str, path: Optional[Path] = None) -> Figure:
    """Small multiples: one panel per algorithm X holding X (solid) and X+LAG (dashed), with FedAvg
    (grey) and FedLAG (black) repeated in every panel as references; shared axes."""
    references = {n: curves[n] for n in REFERENCES if n in curves}
    panels: Dict[str, Dict[str, Curve]] = {}
    for name, curve in curves.items():
        if name not in references:
            panels.setdefault(row_base(name), {})[name] = curve
    cols = min(6, len(panels))
    rows = int(np.ceil(len(panels) / cols))
    titles = {base: textwrap.fill(base, 36) for base in panels}  # a panel is 2.7 inches wide
    title_lines = max(t.count("\n") for t in titles.values()) + 1
    fig, axes = plt.subplots(rows, cols, figsize=(2.7 * cols, (2.0 + 0.15 * title_lines) * rows + 1.0), sharex=True,
                             sharey=True, squeeze=False)
    for ax, (base, own) in zip(axes.flat, panels.items()):
        styles = dict(REFERENCE_STYLES)
        styles.update({n: {"color": "tab:blue", "linestyle": "--" if row_algorithm(n).endswith(LAG_SUFFIX) else "-",
                           "linewidth": 1.7} for n in own})
        draw_accuracy_curves(ax, {**references, **own}, styles)
        ax.set_title(titles[base], fontsize=9 if title_lines == 1 else 7)
        ax.set_ylim(0, 100)
        ax.label_outer()
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    handles = [plt.Line2D([], [], color="tab:blue", linewidth=1.7), plt.Line2D([], [], color="tab:blue",
               linestyle="--", linewidth=1.7)] + [plt.Line2D([], [], **REFERENCE_STYLES[n]) for n in references]
    fig.legend(handles, ["X (panel title)", "X+LAG"] + list(references), loc="lower center",
               ncol=len(handles), fontsize=9, frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.45 / fig.get_size_inches()[1], 1, 1))
    return _save(fig, path)


def plot_accuracy_overview(panels: Dict[str, Dict[str, Curve]], title: str, path: Optional[Path] = None) -> Figure:
    """All datasets side by side (one panel each), one shared legend."""
    names = list(dict.fromkeys(n for curves in panels.values() for n in curves))
    styles = algorithm_styles(names)
    cols = 2 if len(panels) == 4 else min(len(panels), 3)
    rows = int(np.ceil(len(panels) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows), squeeze=False)
    repeats: Dict[str, list] = {}
    for ax, (label, curves) in zip(axes.flat, panels.items()):
        for name, same in draw_accuracy_curves(ax, curves, styles).items():
            repeats.setdefault(name, []).append(same)
        ax.set_title(label, fontsize=10)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    handles = [plt.Line2D([], [], **{k: v for k, v in styles[n].items() if k != "markevery"}) for n in names]
    labels = [overview_label(n, repeats.get(n, []), sum(n in c for c in panels.values())) for n in names]
    # As many entries a legend row as the figure's width holds (about 0.07 inch a character at size 8).
    ncol = max(1, min(6, len(names), int(fig.get_size_inches()[0] / (0.07 * max(map(len, labels)) + 0.6))))
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    fig.suptitle(title)
    legend_rows = int(np.ceil(len(names) / ncol))
    height = fig.get_size_inches()[1]
    fig.tight_layout(rect=(0, (0.22 * legend_rows + 0.12) / height, 1, 1))
    return _save(fig, path)


def overview_label(name: str, repeats: Sequence[str], panels: int) -> str:
    """The shared legend's entry of ``name``, which repeats the curves ``repeats`` in some of its ``panels``."""
    if not repeats:
        return name
    others = "/".join(dict.fromkeys(repeats))
    return f"{name} (= {others})" if len(repeats) == panels else f"{name} (= {others} in {len(repeats)} of {panels})"


def plot_conflict_heatmap(layer_names: Sequence[str], scores: np.ndarray, title: str,
                          path: Optional[Path] = None, personal: Optional[np.ndarray] = None,
                          uploads: Optional[np.ndarray] = None, normalise: bool = False) -> Figure:
    """Layers (y, input at the top) x rounds (x), colour = conflict score GC_xi of the layer in the round.

    ``scores`` is rounds x layers, as recorded in ``lag_conflict_scores``. With ``normalise`` each round
    is divided by C(uploads, 2), the number of client pairs, so the colour is the fraction of pairs in
    conflict. ``personal`` (rounds x layers, bool) marks the layers chosen as personal in each round.
    """
    scores = np.asarray(scores, dtype=float)
    rounds, layers = scores.shape
    if len(layer_names) != layers:
        raise ValueError(f"{len(layer_names)} layer names for {layers} score columns")
    values = scores.T  # layers x rounds
    label = "conflicting client pairs  GC$_\\xi$(layer)"
    if normalise:
        if uploads is None or len(uploads) != rounds:
            raise ValueError("normalising needs the number of uploads of every round")
        pairs = np.asarray(uploads, dtype=float) * (np.asarray(uploads, dtype=float) - 1) / 2
        with np.errstate(invalid="ignore", divide="ignore"):
            values = np.where(pairs > 0, values / np.where(pairs > 0, pairs, 1), np.nan)
        label = "fraction of client pairs in conflict"
    height = min(max(3.0, 0.28 * layers + 1.6), 16.0)
    fig, ax = plt.subplots(figsize=(9.0, height))
    image = ax.imshow(values, aspect="auto", interpolation="nearest", cmap="viridis",
                      extent=(-0.5, rounds - 0.5, layers - 0.5, -0.5),
                      vmin=0, vmax=1 if normalise else None)
    ax.set_yticks(range(layers))
    ax.set_yticklabels(list(layer_names), fontsize=7 if layers > 20 else 8)
    ax.set_xlabel("round")
    ax.set_ylabel("layer (input at top)")
    ax.set_title(title)
    cax = make_axes_locatable(ax).append_axes("right", size=0.18, pad=0.12)  # inches: as tall as the map
    bar = fig.colorbar(image, cax=cax)
    bar.set_label(label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if personal is not None and np.asarray(personal).any():
        r, l = np.nonzero(np.asarray(personal, dtype=bool))
        size = float(np.clip(600.0 / max(rounds, 1), 1.5, 30.0))
        ax.scatter(r, l, s=size, marker="o", facecolors="none", edgecolors="red", linewidths=0.8)
        ax.set_xlabel("round   (red circles: layers chosen as personal in that round)")
    fig.tight_layout()
    return _save(fig, path)


# Colour of a client alone in its group for a layer (drawn, but no group); the group palettes hold no grey.
ALONE_COLOUR = (0.85, 0.85, 0.85, 1.0)
TAB10_GREY, TAB20_GREYS = 7, (14, 15)
# Groups named one by one in a legend; with more, the colours alone tell them apart.
LEGEND_GROUPS = 18


def group_colours(count: int) -> List[Tuple[float, float, float, float]]:
    """``count`` RGBA colours, no two alike and none grey: tab10 for up to 9 groups, tab20's dark shades before
    its light ones for up to 18 (so that groups next to each other do not get two shades of one hue), and
    beyond that hues a golden-ratio turn apart at three lightnesses (distinct for any count, if ever closer)."""
    if count <= 9:
        return [plt.get_cmap("tab10")(i) for i in range(10) if i != TAB10_GREY][:count]
    if count <= 18:
        order = [i for i in (*range(0, 20, 2), *range(1, 20, 2)) if i not in TAB20_GREYS]
        return [plt.get_cmap("tab20")(i) for i in order][:count]
    hsv = [((0.618033988749895 * i) % 1.0, (0.85, 0.6, 0.45)[i % 3], (0.85, 0.65, 0.95)[i % 3]) for i in range(count)]
    return [(*matplotlib.colors.hsv_to_rgb(c), 1.0) for c in hsv]


def plot_client_groups(groups: np.ndarray, layer_name: str, title: str, path: Optional[Path] = None) -> Figure:
    """Clients (y) x rounds (x), colour = the client's group for one personal layer (``--lag_share groups``).

    ``groups`` is rounds x clients, one layer's slice of ``lag_groups``: each client's group named by its
    smallest client id, -1 (left blank) in rounds where the layer was shared. Each group that holds two or
    more clients in some round has its own colour (:func:`group_colours`, in the order of the group ids), so
    two clients share a colour in a round exactly when they share a group; a client alone in its group is
    light grey. The image is an RGBA array: clients x rounds x 4.
    """
    groups = np.asarray(groups)
    rounds, clients = groups.shape
    sizes = np.zeros_like(groups)
    for r in range(rounds):
        labels, counts = np.unique(groups[r], return_counts=True)
        sizes[r] = counts[np.searchsorted(labels, groups[r])]
    shared = (groups >= 0) & (sizes > 1)
    ids = np.unique(groups[shared])
    palette = group_colours(len(ids))
    image = np.zeros((clients, rounds, 4))  # transparent: the layer was shared by all that round
    alone = (groups >= 0) & (sizes == 1)
    image[alone.T] = ALONE_COLOUR
    for group, colour in zip(ids, palette):
        image[(shared & (groups == group)).T] = colour
    height = min(max(3.0, 0.12 * clients + 1.6), 16.0)
    legend = 0 < len(ids) <= LEGEND_GROUPS
    fig, ax = plt.subplots(figsize=(10.5 if legend else 9.0, height))
    ax.set_facecolor("white")
    ax.imshow(image, aspect="auto", interpolation="nearest", extent=(-0.5, rounds - 0.5, clients - 0.5, -0.5))
    if legend:
        entries = [(c, f"group of client {g}") for g, c in zip(ids, palette)]
        entries += [(ALONE_COLOUR, "alone")] if alone.any() else []
        ax.legend([matplotlib.patches.Patch(color=c) for c, _ in entries], [text for _, text in entries], fontsize=7,
                  loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_xlabel(f"round   (colour: the group sharing {layer_name}; grey: alone; blank: shared by all)")
    ax.set_ylabel("client")
    ax.set_title(title)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    return _save(fig, path)


def plot_personal_frequency(layer_names: Sequence[str], mean: np.ndarray, std: Optional[np.ndarray],
                            title: str, path: Optional[Path] = None) -> Figure:
    """Horizontal bars: the fraction of rounds each layer was personal (mean over runs, +- std)."""
    layers = len(layer_names)
    height = min(max(2.8, 0.28 * layers + 1.4), 16.0)
    fig, ax = plt.subplots(figsize=(7.5, height))
    positions = np.arange(layers)
    show_err = std is not None and np.any(np.asarray(std) > 0)
    ax.barh(positions, np.asarray(mean), xerr=np.asarray(std) if show_err else None, color="tab:red",
            alpha=0.75, capsize=2)
    ax.set_yticks(positions)
    ax.set_yticklabels(list(layer_names), fontsize=7 if layers > 20 else 8)
    ax.invert_yaxis()  # input at the top, as in the heatmap
    ax.set_xlim(0, 1.1)
    ends = np.asarray(mean) + (np.asarray(std) if show_err else 0)
    for y, value, end in zip(positions, np.asarray(mean), np.broadcast_to(ends, (layers,))):
        ax.text(min(end, 1.0) + 0.012, y, f"{value:.2f}", va="center", fontsize=7)
    ax.set_xlabel("fraction of rounds kept personal")
    ax.set_ylabel("layer")
    ax.set_title(title)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def plot_dlg_psnr(curves: Dict[str, Curve], title: str, path: Optional[Path] = None) -> Figure:
    """One line per algorithm (the accuracy curves' colours and dashes): the mean over seeds of ``-dlg``'s PSNR
    in dB (``rs_dlg_psnr``: each round's mean over its attacked images) against the attacked round, a dot at
    each, +- std over seeds shaded. Lower: the uploads revealed less. A curve that another holds point for
    point is drawn over it in short dashes and named, as on the accuracy curves."""
    styles = algorithm_styles(list(curves))
    repeats = repeated_curves(curves)
    fig, ax = plt.subplots(figsize=(8.5, 5.0))
    for name, (rounds, mean, std, count) in curves.items():
        style = {"marker": "o", "markersize": 3.5, **styles[name], **(REPEAT_STYLE if name in repeats else {})}
        style.pop("markevery", None)  # few points: every one is marked
        runs = int(np.max(count)) if len(count) else 0
        same = f"= {repeats[name]}, " if name in repeats else ""
        ax.plot(rounds, mean, label=textwrap.fill(f"{name} ({same}n={runs})", LEGEND_WRAP), **style)
        if runs > 1:
            ax.fill_between(rounds, mean - std, mean + std, color=style["color"], alpha=0.18, linewidth=0)
    ax.set_xlabel("round (attacked every -dlgg rounds)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("DLG PSNR (dB), mean over attacked images")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return _save(fig, path)


def _save(fig: Figure, path: Optional[Path]) -> Figure:
    if path is not None:
        with atomic_path(Path(path)) as tmp:
            fig.savefig(tmp, dpi=DPI, format=Path(path).suffix.lstrip(".") or "png")
    plt.close(fig)
    return fig
