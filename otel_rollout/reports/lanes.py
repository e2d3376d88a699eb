"""The step picture of an agentic step: one lane per trajectory, its turns and tool calls on it.

In an agentic step a bar per request hides what the step waited for: a trajectory of six short
turns and a slow sandbox call looks like six harmless requests. A lane per trajectory, sorted by
when it ended, shows the conversation: turns (engine requests) in blue, tool calls in green,
scoring in purple, the gaps between them as the loop's own waiting; the slowest trajectories
are named in red with their span ids, so the trace is one search away.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["draw_lanes"]

C_TURN = "#3182bd"
C_TOOL = "#31a354"
C_SCORING = "#756bb1"
C_LANE = "#eeeeee"
C_SLOW = "#a50f15"


def lane_order(trajectories: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Lanes top to bottom: in order of end, so the step's last trajectory is the bottom lane."""
    return sorted(trajectories, key=lambda t: (t["end_ns"], t["start_ns"]))


def draw_lanes(
    ax: Axes, trajectories: Sequence[Mapping[str, Any]], stats: Mapping[str, Any]
) -> None:
    from matplotlib.collections import LineCollection
    from matplotlib.patches import Patch

    lanes = lane_order(trajectories)
    n = len(lanes)
    figure = ax.get_figure(root=True)
    height = figure.get_figheight() if figure is not None else 6.0
    width = max(0.8, min(12.0, 0.8 * 72 * height * 0.78 / max(n, 1)))
    figures = stats.get("trajectories") or {}
    # Name the slowest, but only those at or above p90: with four trajectories the five
    # "slowest" would otherwise be all of them.
    threshold = figures.get("duration_p90_s", 0.0)
    slow_ids = {
        s.get("span_id")
        for s in figures.get("slowest", ())
        if s.get("span_id") and s.get("duration_s", 0.0) >= threshold
    }
    kinds = (("turns", C_TURN), ("tools", C_TOOL), ("scoring", C_SCORING))
    segments: dict[str, list[tuple[tuple[float, float], tuple[float, float]]]] = {
        c: [] for _, c in kinds
    }
    background, slow_rows = [], []
    for y, lane in enumerate(lanes):
        background.append(((lane["start_ns"] / 1e9, y), (lane["end_ns"] / 1e9, y)))
        if lane.get("span_id") in slow_ids:
            slow_rows.append(y)
        for key, colour in kinds:
            for start, end in lane.get(key, ()):
                # a zero-length interval still deserves a visible mark
                segments[colour].append(((start / 1e9, y), (max(end, start + 100_000) / 1e9, y)))
    ax.add_collection(
        LineCollection(background, colors=C_LANE, linewidths=width, capstyle="butt", zorder=1)
    )
    for _, colour in kinds:
        if segments[colour]:
            ax.add_collection(
                LineCollection(
                    segments[colour], colors=colour, linewidths=width, capstyle="butt", zorder=2
                )
            )
    end = max((lane["end_ns"] for lane in lanes), default=0) / 1e9
    for k, y in enumerate(
        sorted(slow_rows, key=lambda r: lanes[r]["start_ns"] - lanes[r]["end_ns"])
    ):
        lane = lanes[y]
        if k < (8 if n <= 40 else 3):
            note = (
                f"{(lane['end_ns'] - lane['start_ns']) / 1e9:.2f} s, {len(lane.get('turns', ()))}"
                f" turns, span {str(lane.get('span_id'))[:8]}…"
            )
            ax.annotate(
                note,
                (lane["end_ns"] / 1e9, y),
                xytext=(4, 0),
                textcoords="offset points",
                va="center",
                fontsize=8,
                color=C_SLOW,
                zorder=4,
            )
    ax.set_xlim(0, end * 1.25 if end > 0 else 1)
    pad = 0.6 if n <= 40 else n * 0.015
    ax.set_ylim(-pad, n - 1 + pad)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the step's first request arrived")
    ax.set_ylabel("trajectories, in order of end")
    if n <= 40:
        ax.set_yticks(range(n))
        ax.set_yticklabels([str(len(lane.get("turns", ()))) for lane in lanes], fontsize=7)
        ax.set_ylabel("trajectories in order of end (label: turns)")
    ax.grid(axis="x", color="#eeeeee", zorder=0)
    handles = [
        Patch(color=C_TURN, label="turn (engine request)"),
        Patch(color=C_TOOL, label="tool call"),
        Patch(color=C_SCORING, label="scoring"),
        Patch(color=C_LANE, label="waiting (the loop's own time)"),
    ]
    if slow_rows:
        handles.append(Patch(color=C_SLOW, label="slowest (duration, turns, span id)"))
    ax.legend(handles=handles, loc="upper right", fontsize=8, framealpha=0.9)
    ax.set_title("Trajectory lanes", fontsize=10, loc="left")
