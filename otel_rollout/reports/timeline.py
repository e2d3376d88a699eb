"""The step's timeline above its requests: its phases and the cause band, on one time axis.

Drawn by :func:`otel_rollout.reports.png.write_png` from a step-log entry's ``phases`` and
``causes`` (times relative to the step's first arrival, like every time of the entry).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["timeline_lane"]

_PHASE_COLOURS = ("#74c476", "#fd8d3c", "#9e9ac8", "#6baed6", "#fdae6b", "#a1d99b", "#bcbddc")

_CAUSE_COLOURS = {
    "length_bound": "#d62728",
    "replica_imbalance": "#e377c2",
    "decode": "#1f77b4",
    "prefill": "#17becf",
    "queue": "#ff7f0e",
    "dispatch": "#bcbd22",
    "agentic_wait": "#8c564b",
    "held": "#7f7f7f",
    "phases": "#2ca02c",
    "framework_gap": "#dddddd",
}
"""One colour per cause (:data:`otel_rollout.attribution.CAUSES`), the same in every picture."""


def timeline_lane(
    lane: Axes,
    below: Axes,
    phases: list[Mapping[str, Any]],
    causes: list[Mapping[str, Any]],
) -> None:
    """The step timeline above the requests, on their time axis (widened to hold what ran before
    the first request or after the last): a bar per top-level phase (generation, reward, weight
    sync, …) and, below it, the cause band — the step's time in order, each piece coloured by
    what the step waited on (:mod:`otel_rollout.attribution`)."""
    rows: list[tuple[str, list[Mapping[str, Any]], str, Mapping[str, str] | None]] = []
    if phases:
        rows.append(("phases", phases, "name", None))
    if causes:
        rows.append(("why", causes, "cause", _CAUSE_COLOURS))
    colours: dict[str, str] = {}
    for y, (_, items, key, fixed) in enumerate(reversed(rows)):
        for item in items:
            name = str(item[key])
            default = _PHASE_COLOURS[len(colours) % len(_PHASE_COLOURS)]
            colour = colours.setdefault(name, fixed.get(name, default) if fixed else default)
            start, end = item["start_ns"] / 1e9, item["end_ns"] / 1e9
            lane.broken_barh([(start, max(end - start, 1e-4))], (y + 0.1, 0.8), color=colour, lw=0)
    spans = [*phases, *causes]
    lo, hi = below.get_xlim()
    lo = min(lo, *(p["start_ns"] / 1e9 for p in spans))
    hi = max(hi, *(p["end_ns"] / 1e9 for p in spans))
    for ax in (lane, below):
        ax.set_xlim(lo, hi)
    lane.set_ylim(0, len(rows))
    lane.set_yticks([y + 0.5 for y in range(len(rows))])
    lane.set_yticklabels([label for label, *_ in reversed(rows)], fontsize=8)
    lane.tick_params(labelbottom=False)
    from matplotlib.patches import Patch

    lane.legend(
        handles=[Patch(color=c, label=n) for n, c in colours.items()],
        loc="center left",
        bbox_to_anchor=(1.0, 0.5),
        fontsize=7,
        frameon=False,
        ncols=2 if len(colours) > 6 else 1,
    )
    lane.set_title(
        "Step phases and why the step took its time" if phases else "Why the step took its time",
        fontsize=10,
        loc="left",
    )
