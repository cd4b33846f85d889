"""A ``Timeline`` as SVG, written by hand (no dependency).

Lanes top to bottom, x scaled so that the drawing stays between MIN_WIDTH and MAX_WIDTH
pixels, a dashed line and a title per section. Each box carries its op's name where it
fits (across the box, else up it, cut short with an ellipsis), not only as hover text; each
sync marker its event's name. A sync the program does not issue is drawn hollow, with no
arrow. The caption under the legend says what x is and whether the syncs drawn ran.
"""

from __future__ import annotations

import textwrap
from html import escape

from .timeline import KERNEL, RECORD, SYNC, WAIT, Box, Timeline

LABEL_WIDTH = 220
LANE_HEIGHT = 84
BOX_HALF = 36  # a kernel box spans the lane's middle +- this
MARKER_Y = 26  # sync markers sit this far below the lane's middle, their names above
TOP = 56
LEGEND_HEIGHT = 48
CAPTION_LINE = 16
MIN_WIDTH, MAX_WIDTH = 1040, 8000  # the legend needs 1040
PX_PER_UNIT = 12.0
CHAR = 0.6  # a sans-serif character's width, in font sizes
ACROSS_FONT, UP_FONT = 11, 9
COLORS = {KERNEL: "#4c72b0", RECORD: "#2ca02c", WAIT: "#d62728", SYNC: "#7f7f7f"}
LEGEND = ((KERNEL, "op / kernel"), (RECORD, "event record"), (WAIT, "wait"), (SYNC, "other sync"))


class Geometry:
    """Pixel positions of a timeline's lanes and x values."""

    def __init__(self, timeline: Timeline) -> None:
        end = max(timeline.end, 1.0)
        plot = min(max(end * PX_PER_UNIT, MIN_WIDTH), MAX_WIDTH)
        self.scale = plot / end
        self.width = LABEL_WIDTH + plot + 20
        chars = max(int((self.width - 16) / (CHAR * 12)), 40)
        self.caption = [row for line in timeline.caption for row in textwrap.wrap(line, chars)]
        self.plot_bottom = TOP + LANE_HEIGHT * max(len(timeline.lanes), 1)
        self.height = self.plot_bottom + LEGEND_HEIGHT + CAPTION_LINE * len(self.caption) + 8
        self.lane_index = {lane: i for i, lane in enumerate(timeline.lanes)}

    def x(self, value: float) -> float:
        return LABEL_WIDTH + value * self.scale

    def y(self, lane: str) -> float:
        """The vertical middle of ``lane``."""
        return TOP + LANE_HEIGHT * self.lane_index[lane] + LANE_HEIGHT / 2


def fitted(text: str, room: float, font: int) -> str:
    """``text`` cut to ``room`` pixels at ``font`` (an ellipsis marks a cut); '' if none fits."""
    chars = int(room / (CHAR * font))
    if len(text) <= chars:
        return text
    return text[: chars - 1] + "\u2026" if chars >= 3 else ""


def _text_up(x: float, bottom: float, room: float, text: str, color: str) -> str:
    """``text`` written upwards from ``bottom``, centred on ``x``, in ``room`` pixels."""
    shown = fitted(text, room, UP_FONT)
    if not shown:
        return ""
    x += UP_FONT / 3  # the baseline sits right of the centre line once rotated
    return (
        f'<text x="{x:.1f}" y="{bottom:.1f}" font-size="{UP_FONT}" fill="{color}" '
        f'transform="rotate(-90 {x:.1f} {bottom:.1f})">{escape(shown)}</text>'
    )


def _box_label(box: Box, x: float, y: float, width: float) -> str:
    """The op's name across the box if it fits, else up it if the box is wide enough."""
    across = fitted(box.label, width - 6, ACROSS_FONT)
    if across == box.label:
        return f'<text x="{x + 3:.1f}" y="{y + 4:.1f}" fill="white">{escape(across)}</text>'
    if width < UP_FONT + 1:
        return ""
    return _text_up(x + width / 2, y + BOX_HALF - 3, 2 * BOX_HALF - 6, box.label, "white")


def marker(kind: str, cx: float, cy: float, title: str, issued: bool = True) -> str:
    """A sync's marker: solid when issued, hollow (outline only) when left out."""
    color, t = COLORS[kind], f"<title>{escape(title)}</title>"
    paint = f'fill="{color}"' if issued else f'fill="white" stroke="{color}" stroke-width="1.5"'
    if kind == RECORD:
        points = f"{cx - 6},{cy + 7} {cx + 6},{cy + 7} {cx},{cy - 7}"
        return f'<polygon points="{points}" {paint}>{t}</polygon>'
    if kind == WAIT:
        return f'<circle cx="{cx}" cy="{cy}" r="6" {paint}>{t}</circle>'
    points = f"{cx - 6},{cy} {cx},{cy - 7} {cx + 6},{cy} {cx},{cy + 7}"
    return f'<polygon points="{points}" {paint}>{t}</polygon>'


def _lanes(timeline: Timeline, g: Geometry) -> list[str]:
    parts = []
    for i, lane in enumerate(timeline.lanes):
        top = TOP + LANE_HEIGHT * i
        fill = "#f4f4f4" if i % 2 else "#ffffff"
        parts.append(
            f'<rect x="0" y="{top}" width="{g.width}" height="{LANE_HEIGHT}" fill="{fill}"/>'
        )
        name = escape(fitted(lane, LABEL_WIDTH - 12, 12))
        parts.append(f'<text x="8" y="{top + LANE_HEIGHT / 2 + 4}">{name}</text>')
    for section in timeline.sections:
        x = g.x(section.start)
        parts.append(
            f'<line x1="{x}" y1="{TOP - 18}" x2="{x}" y2="{g.plot_bottom}" '
            'stroke="#999" stroke-dasharray="4 3"/>'
        )
        title = escape(section.title)
        parts.append(f'<text x="{x + 4}" y="{TOP - 6}" font-weight="bold">{title}</text>')
    return parts


def _items(timeline: Timeline, g: Geometry) -> list[str]:
    parts = []
    for box in timeline.boxes:
        x, y = g.x(box.start), g.y(box.lane)
        width = max(box.length * g.scale - 1, 1)
        if box.kind == KERNEL:
            parts.append(
                f'<rect x="{x:.1f}" y="{y - BOX_HALF}" width="{width:.1f}" '
                f'height="{2 * BOX_HALF}" fill="{COLORS[KERNEL]}">'
                f"<title>{escape(box.title)}</title></rect>"
            )
            parts.append(_box_label(box, x, y, width))
            continue
        cx = x + box.length * g.scale / 2
        parts.append(marker(box.kind, cx, y + MARKER_Y, box.title, box.issued))
        if g.scale >= UP_FONT + 1:
            room = MARKER_Y + BOX_HALF - 10
            parts.append(_text_up(cx, y + MARKER_Y - 10, room, box.label, "#333"))
    for arrow in timeline.arrows:
        x1, y1 = g.x(arrow.start) + g.scale / 2, g.y(arrow.start_lane) + MARKER_Y
        x2, y2 = g.x(arrow.end) + g.scale / 2, g.y(arrow.end_lane) + MARKER_Y
        parts.append(
            f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="#444" stroke-width="1.2" '
            f'marker-end="url(#head)"><title>{escape(arrow.label)}</title></line>'
        )
    return [part for part in parts if part]


def _legend(timeline: Timeline, g: Geometry) -> list[str]:
    y = g.plot_bottom + 26
    parts = [f'<text x="8" y="{y + 4}">legend</text>']  # x is named by the caption below
    x = LABEL_WIDTH
    for kind, text in LEGEND:
        if kind == KERNEL:
            color = COLORS[KERNEL]
            parts.append(f'<rect x="{x - 6}" y="{y - 7}" width="12" height="14" fill="{color}"/>')
        else:
            parts.append(marker(kind, x, y, text))
        parts.append(f'<text x="{x + 10}" y="{y + 4}">{escape(text)}</text>')
        x += 130
    parts.append(marker(WAIT, x, y, "not issued", issued=False))
    parts.append(f'<text x="{x + 10}" y="{y + 4}">hollow: not issued (never ran)</text>')
    x += 230
    parts.append(f'<text x="{x}" y="{y + 4}">arrow: wait on the record it waits for</text>')
    for i, line in enumerate(g.caption):
        top = g.plot_bottom + LEGEND_HEIGHT + CAPTION_LINE * (i + 1)
        parts.append(f'<text x="8" y="{top}" class="caption">{escape(line)}</text>')
    return parts


def to_svg(timeline: Timeline) -> str:
    """The whole drawing as an SVG document."""
    g = Geometry(timeline)
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{g.width:.0f}" height="{g.height}" '
        f'viewBox="0 0 {g.width:.0f} {g.height}" font-family="sans-serif" font-size="12">'
        '<defs><marker id="head" markerWidth="8" markerHeight="8" refX="7" refY="4" '
        'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#444"/></marker></defs>'
        f'<rect width="100%" height="100%" fill="white"/>'
        f'<text x="8" y="20" font-size="15" font-weight="bold">{escape(timeline.title)}</text>'
    )
    return "\n".join(
        [head, *_lanes(timeline, g), *_items(timeline, g), *_legend(timeline, g), "</svg>\n"]
    )
