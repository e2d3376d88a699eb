"""The step's timeline above its requests: its phases, the cause band and a lane per replica,
on one time axis.

Drawn by :func:`otel_rollout.reports.png.write_png` from a step-log entry's ``phases`` and
``causes`` (times relative to the step's first arrival, like every time of the entry).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["MAX_REPLICA_LANES", "replica_lanes", "timeline_lane"]

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


MAX_REPLICA_LANES = 8
"""Replica lanes drawn at most: the latest-ending ones (where a step waits)."""
_REPLICA_COLOUR = "#9ecae1"


def replica_lanes(requests: list[Mapping[str, Any]]) -> list[tuple[str, Mapping[str, Any]]]:
    """One lane per replica of the step (two or more), latest end last: a bar from its first
    request's arrival to its last finish, labelled with its name and its requests."""
    spans: dict[str, list[int]] = {}
    for r in requests:
        name = r.get("replica")
        if name is None:
            continue
        span = spans.setdefault(str(name), [r["arrival_ns"], r["finish_ns"], 0])
        span[0], span[1] = min(span[0], r["arrival_ns"]), max(span[1], r["finish_ns"])
        span[2] += 1
    if len(spans) < 2:
        return []
    ordered = sorted(spans.items(), key=lambda kv: (kv[1][1], kv[0]))[-MAX_REPLICA_LANES:]
    return [
        (f"{name} ({n})", {"name": "replica busy", "start_ns": start, "end_ns": end})
        for name, (start, end, n) in ordered
    ]


def timeline_lane(
    lane: Axes,
    below: Axes,
    phases: list[Mapping[str, Any]],
    causes: list[Mapping[str, Any]],
    replicas: Sequence[tuple[str, Mapping[str, Any]]] = (),
) -> None:
    """The step timeline above the requests, on their time axis (widened to hold what ran before
    the first request or after the last): a bar per top-level phase (generation, reward, weight
    sync, …); below it, the cause band — the step's time in order, each piece coloured by what
    the step waited on (:mod:`otel_rollout.attribution`); below that, a lane per replica
    (:func:`replica_lanes`): where one ends far after the others, the step waited on it."""
    rows: list[tuple[str, list[Mapping[str, Any]], str, Mapping[str, str] | None]] = []
    if phases:
        rows.append(("phases", phases, "name", None))
    if causes:
        rows.append(("why", causes, "cause", _CAUSE_COLOURS))
    for label, busy in replicas:
        rows.append((label, [busy], "name", {"replica busy": _REPLICA_COLOUR}))
    colours: dict[str, str] = {}
    for y, (_, items, key, fixed) in enumerate(reversed(rows)):
        for item in items:
            name = str(item[key])
            default = _PHASE_COLOURS[len(colours) % len(_PHASE_COLOURS)]
            colour = colours.setdefault(name, fixed.get(name, default) if fixed else default)
            start, end = item["start_ns"] / 1e9, item["end_ns"] / 1e9
            lane.broken_barh([(start, max(end - start, 1e-4))], (y + 0.1, 0.8), color=colour, lw=0)
    spans = [*phases, *causes, *(busy for _, busy in replicas)]
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
