"""Markdown tables and matplotlib plots shared by the training benchmarks.

A table is a list of column names and rows of already formatted cells;
:func:`markdown` pads them into a GitHub table (numbers right-aligned).
The plots take plain series, ``{label: [(x, y), ...]}``, so this module knows
nothing about runs or workloads; a point ``(x, y, low, high)`` (a bar's or
labelled point's value ``(y, low, high)``) draws ``low..high`` as an error bar,
as the benchmarks draw the range of their repeats.
"""
from __future__ import annotations

import math
import os
from typing import Any, Sequence

Series = dict[str, list[tuple[float, ...]]]  # (x, y) or (x, y, low, high)


def allocator() -> str:
    """glibc's allocator tunables this process runs with (``MALLOC_*``; README, "Host memory"), as
    ``"NAME=value, ..."``, or ``"glibc's defaults"``: they change step times on the host, so every
    benchmark says which it ran with."""
    tunables = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("MALLOC_"))
    return ", ".join(tunables) or "glibc's defaults"


def _errors(ys: Sequence[float], bounds: Sequence[tuple[float, ...]]) -> list[list[float]] | None:
    """matplotlib's ``yerr`` (distances below and above) from ``(low, high)`` pairs, if any were given;
    never below zero (the mean of equal repeats can round past them: fastText's, deterministic)."""
    if not bounds or any(len(b) != 2 for b in bounds):
        return None
    return [[max(y - b[0], 0.0) for y, b in zip(ys, bounds)], [max(b[1] - y, 0.0) for y, b in zip(ys, bounds)]]


def markdown(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub markdown table; a column whose cells all read as numbers (a spread after one,
    ``"50.1 (49.0..52.3)"``, allowed) is right-aligned."""
    if any(len(r) != len(headers) for r in rows):
        raise ValueError(f"every row needs {len(headers)} cells")
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    right = [bool(rows) and all(_numeric(r[i]) for r in rows) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if r else ("-" * (w + 2)) for w, r in zip(widths, right)) + "|"
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def _numeric(cell: str) -> bool:
    text = cell.split(" (", 1)[0].strip().rstrip("x%").replace(",", "")
    if text in ("", "-"):
        return True
    try:
        float(text)
    except ValueError:
        return False
    return True


def number(value: float | None, digits: int = 3, suffix: str = "") -> str:
    """``value`` with ``digits`` significant digits, ``-`` for a missing or non-finite one."""
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.{digits}g}{suffix}"


def _triple(value: float | tuple[float, float, float]) -> tuple[float, ...]:
    return (value,) if isinstance(value, (int, float)) else tuple(value)


def _axes(panels: int, title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(panels, 2)
    rows = -(-panels // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.2 * rows), squeeze=False)
    for ax in axes.flat[panels:]:
        ax.set_visible(False)
    fig.suptitle(title)
    return fig, list(axes.flat[:panels])


def _style(ax, title: str, xlabel: str, ylabel: str, log: str) -> None:
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel,
           xscale="log" if "x" in log else "linear", yscale="log" if "y" in log else "linear")
    ax.grid(True, which="both", alpha=0.3)
    from matplotlib.ticker import FuncFormatter

    for axis, scale in ((ax.xaxis, "x"), (ax.yaxis, "y")):
        if scale in log:  # 0.01, 1, 100 rather than 10^-2, 10^0, 10^2
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.1g}"[0] in "125" else ""))
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _save(fig, path: str) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


#: How the labels past matplotlib's ten colours differ: by marker and line (lines), by hatch (bars).
_MARKERS, _LINES, _HATCHES = "os^Dv", ("-", "--", ":", "-.", (0, (1, 3))), ("", "//", "..", "xx", "\\\\")


def looks(labels: Sequence[str]) -> dict[str, dict[str, Any]]:
    """A look per label, distinct for every label and the same in every panel it is drawn in: its
    colour (``"color"``, matplotlib's ten in turn) and, for each further ten labels, another
    ``"marker"`` and ``"linestyle"`` for a line and ``"hatch"`` for a bar."""
    return {label: {"color": f"C{i % 10}", "marker": _MARKERS[i // 10 % 5], "linestyle": _LINES[i // 10 % 5],
                    "hatch": _HATCHES[i // 10 % 5]}
            for i, label in enumerate(dict.fromkeys(labels))}


def _line(look: dict[str, Any]) -> dict[str, Any]:
    """A :func:`looks` entry as a line's keyword arguments."""
    return {key: look[key] for key in ("color", "marker", "linestyle")}


def _bar(look: dict[str, Any]) -> dict[str, Any]:
    """A :func:`looks` entry as a bar's keyword arguments (a hatch drawn in white on the colour)."""
    return {"color": look["color"], "hatch": look["hatch"], "edgecolor": "white" if look["hatch"] else None}


def line_plot(panels: dict[str, Series], path: str, title: str, xlabel: str, ylabel: str, log: str = "") -> None:
    """One panel per key of ``panels``, a line with markers per label in it, each label drawn alike
    in every panel (:func:`looks`); ``log`` names the log-scaled axes (``"x"``, ``"xy"``)."""
    fig, axes = _axes(len(panels), title)
    look = looks([label for series in panels.values() for label in series])
    for ax, (name, series) in zip(axes, panels.items()):
        for label, points in series.items():
            if points:
                points = sorted(points)
                xs, ys = [p[0] for p in points], [p[1] for p in points]
                ax.errorbar(xs, ys, yerr=_errors(ys, [p[2:] for p in points]), label=label, markersize=4,
                            capsize=2, **_line(look[label]))
        _style(ax, name, xlabel, ylabel, log)
    _save(fig, path)


def bar_plot(groups: dict[str, dict[str, float | tuple[float, float, float]]], path: str, title: str, ylabel: str,
             log: bool = False) -> None:
    """Grouped bars: ``groups[group][label]`` (e.g. per cluster cell, bytes per compressor), a
    value or ``(value, low, high)``."""
    fig, (ax,) = _axes(1, "")
    look = looks([label for bars in groups.values() for label in bars])
    width = 0.8 / max(len(look), 1)
    for i, label in enumerate(look):
        xs = [g for g, bars in enumerate(groups.values()) if label in bars]
        values = [_triple(bars[label]) for bars in groups.values() if label in bars]
        ys = [v[0] for v in values]
        ax.bar([x + (i - (len(look) - 1) / 2) * width for x in xs], ys, width, label=label,
               yerr=_errors(ys, [v[1:] for v in values]), capsize=2, **_bar(look[label]))
    _style(ax, title, "", ylabel, "y" if log else "")  # before the ticks: setting a scale resets them
    ax.set_xticks(range(len(groups)), list(groups), fontsize=8)
    _save(fig, path)



def stacked_bar_plot(panels: dict[str, dict[str, dict[str, float]]], parts: Sequence[str], path: str, title: str,
                     ylabel: str) -> None:
    """One panel per key of ``panels``, a bar per label in it stacked from its ``parts`` in their order
    (``panels[panel][label][part]``; a part missing from a label's bar is left out of it)."""
    fig, axes = _axes(len(panels), title)
    look = looks(parts)
    for ax, (name, bars) in zip(axes, panels.items()):
        bottoms = [0.0] * len(bars)
        for part in parts:
            heights = [stack.get(part, 0.0) for stack in bars.values()]
            ax.bar(range(len(bars)), heights, 0.7, bottom=bottoms, label=part, **_bar(look[part]))
            bottoms = [b + h for b, h in zip(bottoms, heights)]
        _style(ax, name, "", ylabel, "")
        ax.set_xticks(range(len(bars)), list(bars), fontsize=7, rotation=30, ha="right")
    _save(fig, path)

def scatter_plot(points: dict[str, tuple[float, ...]], path: str, title: str, xlabel: str, ylabel: str,
                 log: str = "") -> None:
    """One labelled point per key: ``points[label] = (x, y)`` or ``(x, y, low, high)`` (e.g. bytes per
    step against quality)."""
    fig, (ax,) = _axes(1, "")
    for label, (x, y, *bounds) in points.items():
        ax.errorbar([x], [y], yerr=_errors([y], [tuple(bounds)]), fmt="o", markersize=6, capsize=2)
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    _style(ax, title, xlabel, ylabel, log)
    _save(fig, path)
