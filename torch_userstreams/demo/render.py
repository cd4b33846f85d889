"""Drawing a ``Timeline``: SVG written by hand (no dependency), other formats by matplotlib.

Both use one geometry (``_Geometry``): lanes top to bottom, x scaled so the drawing stays
between MIN_WIDTH and MAX_WIDTH pixels, a dashed line and a title per section.
"""

from __future__ import annotations

import importlib.util
from html import escape
from pathlib import Path

from .timeline import KERNEL, RECORD, SYNC, WAIT, Timeline

LABEL_WIDTH = 220
LANE_HEIGHT = 30
TOP = 56
BOTTOM = 56
MIN_WIDTH, MAX_WIDTH = 600, 2400
PX_PER_UNIT = 12.0
COLORS = {KERNEL: "#4c72b0", RECORD: "#2ca02c", WAIT: "#d62728", SYNC: "#7f7f7f"}
LEGEND = ((KERNEL, "op / kernel"), (RECORD, "event record"), (WAIT, "wait"), (SYNC, "other sync"))


def can_render(path: Path) -> str | None:
    """None if ``path`` can be written here, else a message saying what to do instead."""
    if path.suffix.lower() == ".svg" or importlib.util.find_spec("matplotlib") is not None:
        return None
    return (
        f"--timeline {path}: writing a {path.suffix or 'suffix-less'} file needs matplotlib, "
        "which is not installed. Run `pip install matplotlib`, or give a .svg path (written "
        "without any dependency), e.g. --timeline timeline.svg"
    )


class _Geometry:
    """Pixel positions of a timeline's lanes and x values."""

    def __init__(self, timeline: Timeline) -> None:
        end = max(timeline.end, 1.0)
        plot = min(max(end * PX_PER_UNIT, MIN_WIDTH), MAX_WIDTH)
        self.scale = plot / end
        self.width = LABEL_WIDTH + plot + 20
        self.height = TOP + LANE_HEIGHT * max(len(timeline.lanes), 1) + BOTTOM
        self.lane_index = {lane: i for i, lane in enumerate(timeline.lanes)}

    def x(self, value: float) -> float:
        return LABEL_WIDTH + value * self.scale

    def y(self, lane: str) -> float:
        """The vertical middle of ``lane``."""
        return TOP + LANE_HEIGHT * self.lane_index[lane] + LANE_HEIGHT / 2


def _svg_marker(kind: str, cx: float, cy: float, title: str) -> str:
    color, t = COLORS[kind], f"<title>{escape(title)}</title>"
    if kind == RECORD:
        points = f"{cx - 6},{cy + 7} {cx + 6},{cy + 7} {cx},{cy - 7}"
        return f'<polygon points="{points}" fill="{color}">{t}</polygon>'
    if kind == WAIT:
        return f'<circle cx="{cx}" cy="{cy}" r="6" fill="{color}">{t}</circle>'
    points = f"{cx - 6},{cy} {cx},{cy - 7} {cx + 6},{cy} {cx},{cy + 7}"
    return f'<polygon points="{points}" fill="{color}">{t}</polygon>'


def _svg_lanes(timeline: Timeline, g: _Geometry) -> list[str]:
    parts = []
    for i, lane in enumerate(timeline.lanes):
        top = TOP + LANE_HEIGHT * i
        fill = "#f4f4f4" if i % 2 else "#ffffff"
        parts.append(
            f'<rect x="0" y="{top}" width="{g.width}" height="{LANE_HEIGHT}" fill="{fill}"/>'
        )
        parts.append(f'<text x="8" y="{top + LANE_HEIGHT / 2 + 4}">{escape(lane)}</text>')
    for section in timeline.sections:
        x = g.x(section.start)
        parts.append(
            f'<line x1="{x}" y1="{TOP - 18}" x2="{x}" y2="{g.height - BOTTOM}" '
            'stroke="#999" stroke-dasharray="4 3"/>'
        )
        title = escape(section.title)
        parts.append(f'<text x="{x + 4}" y="{TOP - 6}" font-weight="bold">{title}</text>')
    return parts


def _svg_items(timeline: Timeline, g: _Geometry) -> list[str]:
    parts = []
    for box in timeline.boxes:
        x, y = g.x(box.start), g.y(box.lane)
        if box.kind == KERNEL:
            w = max(box.length * g.scale - 1, 1)
            parts.append(
                f'<rect x="{x}" y="{y - 9}" width="{w}" height="18" fill="{COLORS[KERNEL]}">'
                f"<title>{escape(box.label)}</title></rect>"
            )
        else:
            parts.append(_svg_marker(box.kind, x + box.length * g.scale / 2, y, box.label))
    for arrow in timeline.arrows:
        x1, y1 = g.x(arrow.start) + g.scale / 2, g.y(arrow.start_lane)
        x2, y2 = g.x(arrow.end) + g.scale / 2, g.y(arrow.end_lane)
        parts.append(
            f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="#444" stroke-width="1.2" '
            f'marker-end="url(#head)"><title>{escape(arrow.label)}</title></line>'
        )
    return parts


def _svg_legend(timeline: Timeline, g: _Geometry) -> list[str]:
    y = g.height - BOTTOM + 26
    parts = [f'<text x="8" y="{y + 4}">x: {escape(timeline.unit)}</text>']
    x = LABEL_WIDTH
    for kind, text in LEGEND:
        if kind == KERNEL:
            color = COLORS[KERNEL]
            parts.append(f'<rect x="{x - 6}" y="{y - 7}" width="12" height="14" fill="{color}"/>')
        else:
            parts.append(_svg_marker(kind, x, y, text))
        parts.append(f'<text x="{x + 10}" y="{y + 4}">{escape(text)}</text>')
        x += 130
    parts.append(f'<text x="{x}" y="{y + 4}">arrow: wait on the record it waits for</text>')
    return parts


def to_svg(timeline: Timeline) -> str:
    """The whole drawing as an SVG document."""
    g = _Geometry(timeline)
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{g.width:.0f}" height="{g.height}" '
        f'viewBox="0 0 {g.width:.0f} {g.height}" font-family="sans-serif" font-size="12">'
        '<defs><marker id="head" markerWidth="8" markerHeight="8" refX="7" refY="4" '
        'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#444"/></marker></defs>'
        f'<rect width="100%" height="100%" fill="white"/>'
        f'<text x="8" y="20" font-size="15" font-weight="bold">{escape(timeline.title)}</text>'
    )
    return "\n".join(
        [
            head,
            *_svg_lanes(timeline, g),
            *_svg_items(timeline, g),
            *_svg_legend(timeline, g),
            "</svg>\n",
        ]
    )


def to_image(timeline: Timeline, path: Path) -> None:
    """Any format matplotlib writes (PNG, PDF, ...), laid out like the SVG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = _Geometry(timeline)
    fig, ax = plt.subplots(figsize=(g.width / 100, g.height / 100), dpi=100)
    lanes = {lane: len(timeline.lanes) - 1 - i for i, lane in enumerate(timeline.lanes)}
    markers = {RECORD: "^", WAIT: "o", SYNC: "D"}
    for box in timeline.boxes:
        y = lanes[box.lane]
        if box.kind == KERNEL:
            ax.broken_barh([(box.start, box.length * 0.92)], (y - 0.3, 0.6), color=COLORS[KERNEL])
        else:
            ax.plot(box.start + box.length / 2, y, markers[box.kind], color=COLORS[box.kind])
    for arrow in timeline.arrows:
        start = (arrow.start + 0.5, lanes[arrow.start_lane])
        end = (arrow.end + 0.5, lanes[arrow.end_lane])
        ax.annotate("", xy=end, xytext=start, arrowprops={"arrowstyle": "->", "color": "#444"})
    top = len(timeline.lanes) - 0.5
    for section in timeline.sections:
        ax.axvline(section.start, color="#999", linestyle="--", linewidth=0.8)
        ax.text(section.start, top + 0.1, " " + section.title, fontweight="bold", va="bottom")
    for kind, text in LEGEND:
        style = "s" if kind == KERNEL else markers[kind]
        ax.plot([], [], style, color=COLORS[kind], label=text)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=len(LEGEND), frameon=False)
    ax.set_ylim(-0.6, top + 0.6)
    ax.set_yticks(list(lanes.values()), list(lanes))
    ax.set_xlabel(timeline.unit)
    ax.set_title(timeline.title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def render(timeline: Timeline, path: Path) -> None:
    """Write ``timeline`` to ``path``; the suffix picks SVG (by hand) or matplotlib."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".svg":
        path.write_text(to_svg(timeline))
    else:
        to_image(timeline, path)
