"""Small charts drawn on the server: an inline SVG sparkline of a power series (no script, no CDN)."""

from __future__ import annotations

from collections.abc import Sequence

from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from facility.power import kw


def sparkline(
    values: Sequence[float], *, limit: float | None = None, width: int = 120, height: int = 24, title: str = ""
) -> SafeString:
    """A polyline of `values` (oldest first), scaled to the larger of their peak and `limit`; the limit as a
    dashed line. Empty when there are fewer than two points."""
    if len(values) < 2:
        return mark_safe('<span class="spark-none muted small">no history yet</span>')
    top = max(max(values), limit or 0) or 1.0
    step = width / (len(values) - 1)
    points = " ".join(f"{i * step:.1f},{height - 1 - (height - 2) * v / top:.1f}" for i, v in enumerate(values))
    limit_line = ""
    if limit:
        y = height - 1 - (height - 2) * limit / top
        limit_line = f'<line class="spark-limit" x1="0" x2="{width}" y1="{y:.1f}" y2="{y:.1f}"/>'
    label = title or f"{len(values)} points, peak {kw(max(values))}, last {kw(values[-1])}"
    return format_html(
        '<svg class="spark" width="{}" height="{}" viewBox="0 0 {} {}" role="img" aria-label="{}"><title>{}</title>'
        '{}<polyline points="{}"/></svg>',
        width, height, width, height, label, label, mark_safe(limit_line), points,
    )
