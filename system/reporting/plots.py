"""Figures of a batch of runs (matplotlib, Agg backend: no display needed).

* :func:`plot_accuracy_curves`: test accuracy against round, one line per algorithm, the spread over
  seeds shaded (mean +- std); ``X+LAG`` is drawn dashed in ``X``'s colour. A large grid becomes small
  multiples, one panel per algorithm with FedAvg and FedLAG as references.
* :func:`plot_conflict_heatmap`: FedLAG's per-layer conflict score over rounds, layers x rounds (the
  paper's Fig. 2b), with the layers chosen as personal marked.
* :func:`plot_personal_frequency`: the fraction of rounds each layer was kept personal.

Each function draws one figure, saves it when given a path and returns it (closed figures are still
inspectable), so tests can check axes, labels and data.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

import matplotlib

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


def algorithm_styles(names: Sequence[str]) -> Dict[str, dict]:
    """A colour per base algorithm (``X`` and ``X+LAG`` share it), ``X+LAG`` dashed; FedLAG black and thicker.

    Up to 10 bases use tab10; more use tab20's dark shades before its light ones, then repeat the
    colours with markers, so that no two lines look the same.
    """
    bases = [b for b in dict.fromkeys(lag_base(n) for n in names) if b != "FedLAG"]
    if len(bases) <= 10:
        palette = [plt.get_cmap("tab10")(i) for i in range(10)]
    else:
        tab20 = plt.get_cmap("tab20")
        palette = [tab20(i) for i in range(0, 20, 2)] + [tab20(i) for i in range(1, 20, 2)]
    markers = ("", "o", "s", "^", "D")
    colours = {b: (palette[i % len(palette)], markers[(i // len(palette)) % len(markers)]) for i, b in enumerate(bases)}
    colours["FedLAG"] = ("black", "")
    styles = {}
    for n in names:
        colour, marker = colours[lag_base(n)]
        styles[n] = {"color": colour, "linestyle": "--" if n.endswith(LAG_SUFFIX) else "-",
                     "linewidth": 2.4 if n == "FedLAG" else 1.5}
        if marker:
            styles[n].update(marker=marker, markersize=3, markevery=0.1)
    return styles


def draw_accuracy_curves(ax, curves: Dict[str, Curve], styles: Optional[Dict[str, dict]] = None) -> None:
    """Mean accuracy (%) per algorithm on ``ax``, shaded +- one std over the runs."""
    styles = styles or algorithm_styles(list(curves))
    shade = 0.18 if len(curves) <= 10 else 0.07  # many overlapping bands would hide the lines
    for name, (rounds, mean, std, count) in curves.items():
        style = styles[name]
        runs = int(np.max(count)) if len(count) else 0
        ax.plot(rounds, 100 * mean, label=f"{name} (n={runs})", zorder=3 if name == "FedLAG" else 2, **style)
        if runs > 1:
            ax.fill_between(rounds, 100 * (mean - std), 100 * (mean + std), color=style["color"], alpha=shade,
                            linewidth=0)
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("test accuracy (%)")
    ax.grid(True, alpha=0.3)


# Beyond this many algorithms (X and X+LAG counted once) one axes is unreadable: small multiples instead.
PANEL_LIMIT = 8
# Drawn in every small-multiple panel, so each method is read against them.
REFERENCES = ("FedAvg", "FedLAG")
REFERENCE_STYLES = {"FedAvg": {"color": "0.6", "linestyle": "-", "linewidth": 1.1},
                    "FedLAG": {"color": "black", "linestyle": "-", "linewidth": 1.3}}


def plot_accuracy_curves(curves: Dict[str, Curve], title: str, path: Optional[Path] = None) -> Figure:
    """One line per algorithm: mean test accuracy over seeds against round, +- std shaded.

    More than ``PANEL_LIMIT`` algorithms are drawn as small multiples (:func:`plot_accuracy_panels`).
    """
    if len({lag_base(n) for n in curves if n not in REFERENCES}) > PANEL_LIMIT:
        return plot_accuracy_panels(curves, title, path)
    fig, ax = plt.subplots(figsize=(8.5, 5.0) if len(curves) <= 8 else (10.5, 5.5))
    draw_accuracy_curves(ax, curves)
    ax.set_title(title)
    many = len(curves) > 8
    ax.legend(fontsize=8, loc="upper left" if many else "best", bbox_to_anchor=(1.01, 1.0) if many else None)
    fig.tight_layout()
    return _save(fig, path)


def plot_accuracy_panels(curves: Dict[str, Curve], title: str, path: Optional[Path] = None) -> Figure:
    """Small multiples: one panel per algorithm X holding X (solid) and X+LAG (dashed), with FedAvg
    (grey) and FedLAG (black) repeated in every panel as references; shared axes."""
    references = {n: curves[n] for n in REFERENCES if n in curves}
    panels: Dict[str, Dict[str, Curve]] = {}
    for name, curve in curves.items():
        if name not in references:
            panels.setdefault(lag_base(name), {})[name] = curve
    cols = min(6, len(panels))
    rows = int(np.ceil(len(panels) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(2.7 * cols, 2.1 * rows + 1.0), sharex=True, sharey=True,
                             squeeze=False)
    for ax, (base, own) in zip(axes.flat, panels.items()):
        styles = dict(REFERENCE_STYLES)
        styles.update({n: {"color": "tab:blue", "linestyle": "--" if n.endswith(LAG_SUFFIX) else "-", "linewidth": 1.7}
                       for n in own})
        draw_accuracy_curves(ax, {**references, **own}, styles)
        ax.set_title(base, fontsize=9)
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
    for ax, (label, curves) in zip(axes.flat, panels.items()):
        draw_accuracy_curves(ax, curves, styles)
        ax.set_title(label, fontsize=10)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    handles = [plt.Line2D([], [], **{k: v for k, v in styles[n].items() if k != "markevery"}) for n in names]
    fig.legend(handles, names, loc="lower center", ncol=min(len(names), 6), fontsize=8, frameon=False)
    fig.suptitle(title)
    legend_rows = int(np.ceil(len(names) / 6))
    height = fig.get_size_inches()[1]
    fig.tight_layout(rect=(0, (0.22 * legend_rows + 0.12) / height, 1, 1))
    return _save(fig, path)


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


def plot_client_groups(groups: np.ndarray, layer_name: str, title: str, path: Optional[Path] = None) -> Figure:
    """Clients (y) x rounds (x), colour = the client's group for one personal layer (``--lag_share groups``).

    ``groups`` is rounds x clients, one layer's slice of ``lag_groups``: each client's group named by its
    smallest client id, -1 (left blank) in rounds where the layer was shared. A client alone in its group
    is drawn light grey, so the groups that share stand out.
    """
    groups = np.asarray(groups)
    rounds, clients = groups.shape
    sizes = np.zeros_like(groups)
    for r in range(rounds):
        labels, counts = np.unique(groups[r], return_counts=True)
        sizes[r] = counts[np.searchsorted(labels, groups[r])]
    values = np.where((groups >= 0) & (sizes > 1), groups, np.nan).astype(float).T  # clients x rounds
    height = min(max(3.0, 0.12 * clients + 1.6), 16.0)
    fig, ax = plt.subplots(figsize=(9.0, height))
    ax.set_facecolor("white")
    alone = np.where((groups >= 0) & (sizes == 1), 1.0, np.nan).T
    extent = (-0.5, rounds - 0.5, clients - 0.5, -0.5)
    ax.imshow(alone, aspect="auto", interpolation="nearest", cmap="Greys", vmin=0, vmax=4, extent=extent)
    ax.imshow(values, aspect="auto", interpolation="nearest", cmap="tab20", vmin=0, vmax=max(clients - 1, 1),
              extent=extent)
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


def _save(fig: Figure, path: Optional[Path]) -> Figure:
    if path is not None:
        with atomic_path(Path(path)) as tmp:
            fig.savefig(tmp, dpi=DPI, format=Path(path).suffix.lstrip(".") or "png")
    plt.close(fig)
    return fig
