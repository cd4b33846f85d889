"""Drawing a ``Timeline`` to a file: SVG by hand (``svg``, no dependency), other formats
(PNG, PDF, ...) by matplotlib, laid out like the SVG: the same lanes, op names on the boxes
where they fit, hollow markers for syncs not issued, and the caption under the legend."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from .svg import COLORS, LEGEND, Geometry, to_svg
from .timeline import KERNEL, RECORD, SYNC, WAIT, Timeline

__all__ = ["can_render", "render", "to_image", "to_svg"]
MARKERS = {RECORD: "^", WAIT: "o", SYNC: "D"}


def can_render(path: Path) -> str | None:
    """None if ``path`` can be written here, else a message saying what to do instead."""
    if path.suffix.lower() == ".svg" or importlib.util.find_spec("matplotlib") is not None:
        return None
    return (
        f"--timeline {path}: writing a {path.suffix or 'suffix-less'} file needs matplotlib, "
        "which is not installed. Run `pip install matplotlib`, or give a .svg path (written "
        "without any dependency), e.g. --timeline timeline.svg"
    )


def _draw_boxes(ax: Any, timeline: Timeline, lanes: dict[str, int], scale: float) -> None:
    """Boxes with their op names up them where a box is wide enough (``scale``: px/unit)."""
    for box in timeline.boxes:
        y = lanes[box.lane]
        if box.kind == KERNEL:
            ax.broken_barh([(box.start, box.length * 0.92)], (y - 0.35, 0.7), color=COLORS[KERNEL])
            if box.length * scale < 9:
                continue
            ax.text(
                box.start + box.length * 0.46,
                y,
                box.label,
                rotation=90,
                ha="center",
                va="center",
                fontsize=6,
                color="white",
                clip_on=True,
            )
            continue
        color = COLORS[box.kind]
        face = color if box.issued else "white"
        ax.plot(
            box.start + box.length / 2,
            y - 0.25,
            MARKERS[box.kind],
            color=color,
            markerfacecolor=face,
        )


def to_image(timeline: Timeline, path: Path) -> None:
    """Any format matplotlib writes (PNG, PDF, ...), laid out like the SVG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = Geometry(timeline)
    fig, ax = plt.subplots(figsize=(g.width / 100, g.height / 100), dpi=100)
    lanes = {lane: len(timeline.lanes) - 1 - i for i, lane in enumerate(timeline.lanes)}
    _draw_boxes(ax, timeline, lanes, g.scale)
    for arrow in timeline.arrows:
        start = (arrow.start + 0.5, lanes[arrow.start_lane] - 0.25)
        end = (arrow.end + 0.5, lanes[arrow.end_lane] - 0.25)
        ax.annotate("", xy=end, xytext=start, arrowprops={"arrowstyle": "->", "color": "#444"})
    top = len(timeline.lanes) - 0.5
    for section in timeline.sections:
        ax.axvline(section.start, color="#999", linestyle="--", linewidth=0.8)
        ax.text(section.start, top + 0.1, " " + section.title, fontweight="bold", va="bottom")
    for kind, text in LEGEND:
        style = "s" if kind == KERNEL else MARKERS[kind]
        ax.plot([], [], style, color=COLORS[kind], label=text)
    ax.plot([], [], "o", color=COLORS[WAIT], markerfacecolor="white", label="hollow: not issued")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=len(LEGEND) + 1, frameon=False)
    ax.set_ylim(-0.6, top + 0.6)
    ax.set_yticks(list(lanes.values()), list(lanes))
    ax.set_xlabel(timeline.unit)
    ax.set_title(timeline.title)
    fig.text(0.01, 0.01, "\n".join(g.caption), fontsize=8, va="bottom")
    fig.tight_layout(rect=(0, 0.03 * (len(g.caption) + 1), 1, 1))
    fig.savefig(path)
    plt.close(fig)


def render(timeline: Timeline, path: Path) -> None:
    """Write ``timeline`` to ``path``; the suffix picks SVG (by hand) or matplotlib."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".svg":
        path.write_text(to_svg(timeline))
    else:
        to_image(timeline, path)
