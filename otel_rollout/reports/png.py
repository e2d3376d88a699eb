"""The step picture: a waterfall of the step's requests beside its response-length histogram.

A step's long tail is a picture before it is a number: a waterfall shows at once whether the step
waited on one runaway response or on a slow engine, and whether the engine sat half empty
meanwhile.

matplotlib is optional (``pip install otel-rollout[report]``) and only imported when a PNG is
drawn; it is driven through its object API on the Agg canvas, never through ``pyplot``, so drawing
neither changes the host program's backend nor touches pyplot's global figure state (which is not
thread-safe; steps can end on any thread).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from otel_rollout.record import FINISH_LENGTH
from otel_rollout.reports.lanes import draw_lanes
from otel_rollout.reports.steplog import read_log
from otel_rollout.reports.timeline import replica_lanes, timeline_lane

if TYPE_CHECKING:
    from matplotlib.axes import Axes

INSTALL_HINT = "pip install otel-rollout[report]"

# Colours: queued / waiting for the first token / decoding, and the tail in warm tones.
_C_QUEUE = "#c7c7c7"
_C_PREFILL = "#9ecae1"
_C_DECODE = "#3182bd"
_C_TAIL_DECODE = "#e6550d"
_C_STRAGGLER = "#a50f15"
_C_TAIL_SPAN = "#fdd0a2"
_C_TRUNCATED = "#756bb1"


def render_log(
    path: str | os.PathLike[str], outdir: str | os.PathLike[str], steps: Iterable[int] | None = None
) -> list[str]:
    """Draw a PNG per step of a step log (only ``steps`` if given); returns the written paths.

    A step number seen twice (a resumed run appending to the same log) gets a numbered suffix
    instead of silently overwriting the first picture.
    """
    wanted = set(steps) if steps is not None else None
    seen: dict[str, int] = {}
    written = []
    for entry in read_log(path):
        if wanted is not None and entry.get("step") not in wanted:
            continue
        name = _file_stem(entry)
        seen[name] = seen.get(name, 0) + 1
        suffix = "" if seen[name] == 1 else f"-{seen[name]}"
        written.append(write_png(entry, outdir, filename=f"{name}{suffix}.png"))
    return written


def _file_stem(entry: Mapping[str, Any]) -> str:
    step = entry.get("step")
    return f"step-{step:06d}" if isinstance(step, int) else f"step-t{entry.get('t0_unix_ns', 0)}"


# --- the picture -------------------------------------------------------------------------------


def _matplotlib() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(f"otel_rollout step reports need matplotlib: {INSTALL_HINT}") from exc
    return Figure


def write_png(
    entry: Mapping[str, Any], outdir: str | os.PathLike[str], filename: str | None = None
) -> str:
    """Draw one step: request waterfall (left) beside the response-length histogram (right); a
    step with agentic trajectories gets their lanes (:mod:`otel_rollout.reports.lanes`) instead
    of the waterfall.

    Returns the PNG's path. Raises :class:`ImportError` naming ``otel-rollout[report]`` when
    matplotlib is missing.
    """
    figure_cls = _matplotlib()
    stats = entry["stats"]
    requests = list(entry["requests"])
    trajectories = list(entry.get("trajectories") or ())
    n = len(trajectories) or len(requests)
    height = 5.5 if n <= 40 else 7.0
    phases = list(entry.get("phases") or ())
    causes = list(entry.get("causes") or ())
    replicas = replica_lanes(requests)
    timeline = bool(phases or causes or replicas)
    extra = 0.9 * (bool(phases) + bool(causes)) + 0.3 * len(replicas)
    fig = figure_cls(figsize=(15, height + extra), dpi=110, layout="constrained")
    if timeline:
        rows = bool(phases) + bool(causes) + len(replicas) / 3
        grid = fig.add_gridspec(2, 2, width_ratios=(3.2, 1), height_ratios=(rows, 7))
        lane = fig.add_subplot(grid[0, 0])
        left = fig.add_subplot(grid[1, 0])
        right = fig.add_subplot(grid[:, 1])
    else:
        left, right = fig.subplots(1, 2, width_ratios=(3.2, 1))
    if trajectories:
        draw_lanes(left, trajectories, stats)
    else:
        _waterfall(left, requests, stats)
    if timeline:
        timeline_lane(lane, left, phases, causes, replicas)
    _histogram(right, requests, stats)
    fig.suptitle(_title(entry), fontsize=12, x=0.01, ha="left")
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / (filename or f"{_file_stem(entry)}.png")
    fig.savefig(path, facecolor="white")
    return str(path)


def _title(entry: Mapping[str, Any]) -> str:
    s = entry["stats"]
    step = entry.get("step")
    label = f"Rollout step {step}" if step is not None else "Rollout step"
    trace_id = entry.get("trace_id")
    head = (
        f"{label} — {s['requests']} requests in {s['duration_s']:.2f} s · latency "
        f"p50 {s['latency_p50_s']:.2f} s · p90 {s['latency_p90_s']:.2f} s · "
        f"max {s['latency_max_s']:.2f} s"
    )
    tail = (
        f"tail {s['tail_duration_s']:.2f} s = {s['tail_fraction']:.0%} of the step, after "
        f"{s['tail_quantile']:.0%} had finished ({s['tail_requests']} still running) · "
        f"straggler ratio {s['straggler_ratio']:.1f}× · truncated {s['truncation_ratio']:.0%}"
        f" · idle capacity {s['idle_fraction']:.0%}"
    )
    if trace_id:
        tail += f" · trace {trace_id}"
    inside = _inside_engine(s)
    if inside:
        tail += "\n" + inside
    t = s.get("trajectories")
    if t:
        tail += (
            f"\n{t['count']} trajectories · turns p50 {t['turns_p50']} max {t['turns_max']} · "
            f"duration p50 {t['duration_p50_s']:.2f} s max {t['duration_max_s']:.2f} s · "
            f"time in tools {t['tool_share']:.0%}, generation {t['generation_share']:.0%}"
        )
    return f"{head}\n{tail}"


def _inside_engine(s: Mapping[str, Any]) -> str:
    """Why the step was slow, from the engine's own figures where it reported them: preemptions,
    prefix-cache hits and KV-cache pressure (each absent from a step that lacks it)."""
    parts = []
    if s.get("preemptions") is not None:
        parts.append(f"preemptions {s['preemptions']}")
    cache = s.get("cache")
    if cache and cache.get("prompt_tokens"):
        rate = cache["cached_tokens"] / cache["prompt_tokens"]
        parts.append(f"prefix cache {rate:.0%} of {cache['prompt_tokens']} prompt tokens")
    engine = s.get("engine")
    if engine:
        parts.append(
            f"KV cache peak {engine['kv_cache_usage_peak']:.0%} mean "
            f"{engine['kv_cache_usage_mean']:.0%} · waiting peak {engine['waiting_peak']}"
        )
    return " · ".join(parts)


def _waterfall(ax: Axes, requests: list[dict[str, Any]], stats: Mapping[str, Any]) -> None:
    """One row per request, sorted by finish: the staircase's last steps are the tail.

    Each bar is split where the engine's timeline allows: queued (grey), waiting for the first
    token (light), decoding (dark). Requests finishing inside the tail are drawn in orange and the
    slowest (the summary's stragglers) in dark red, so the eye lands on what the step waited for.
    """
    n = len(requests)
    if n == 0:
        ax.text(0.5, 0.5, "no requests", ha="center", va="center", transform=ax.transAxes)
        return
    rows = sorted(requests, key=lambda r: (r["finish_ns"], r["arrival_ns"]))
    tail_start = stats["tail_start_ns"] / 1e9
    end = max(r["finish_ns"] for r in rows) / 1e9
    # Highlight the summary's stragglers, but only those slower than p90: with 8 requests the
    # five "slowest" would otherwise paint most of the picture red.
    threshold = stats["latency_p90_s"] * 1e9
    listed = {s.get("span_id") for s in stats.get("stragglers", ()) if s.get("span_id")}
    straggler_rows = {
        i
        for i, r in enumerate(rows)
        if (r.get("span_id") in listed or not listed)
        and r["finish_ns"] - r["arrival_ns"] >= threshold
    }
    if not listed:  # no ids to match: the slowest few by latency
        keep = max(1, len(stats.get("stragglers", ())))
        straggler_rows = set(
            sorted(straggler_rows, key=lambda i: rows[i]["arrival_ns"] - rows[i]["finish_ns"])[
                :keep
            ]
        )

    ax.axvspan(
        tail_start,
        end if end > tail_start else tail_start + 1e-9,
        color=_C_TAIL_SPAN,
        alpha=0.55,
        lw=0,
        zorder=0,
    )
    ax.axvline(tail_start, color=_C_TAIL_DECODE, lw=1, ls="--", zorder=1)

    # Bars are line segments: one LineCollection per colour draws 2,000 rows as fast as 8.
    figure = ax.get_figure(root=True)
    height = figure.get_figheight() if figure is not None else 6.0
    row_pts = 72 * height * 0.78 / n
    width = max(0.6, min(9.0, 0.8 * row_pts))
    segments: dict[str, list[tuple[tuple[float, float], tuple[float, float]]]] = {}

    def seg(colour: str, y: int, start_ns: int | None, stop_ns: int | None) -> None:
        if start_ns is None or stop_ns is None or stop_ns <= start_ns:
            return
        segments.setdefault(colour, []).append(((start_ns / 1e9, y), (stop_ns / 1e9, y)))

    for y, r in enumerate(rows):
        arrival, finish = r["arrival_ns"], r["finish_ns"]
        scheduled, first = r.get("scheduled_ns"), r.get("first_token_ns")
        decode_from = first if first is not None else (scheduled or arrival)
        seg(_C_QUEUE, y, arrival, scheduled)
        seg(_C_PREFILL, y, scheduled if scheduled is not None else arrival, first)
        in_tail = finish / 1e9 > tail_start
        colour = _C_STRAGGLER if y in straggler_rows else _C_TAIL_DECODE if in_tail else _C_DECODE
        seg(colour, y, decode_from, finish)
        if finish <= decode_from:  # a zero-length request still deserves a visible mark
            segments.setdefault(colour, []).append(((arrival / 1e9, y), (arrival / 1e9 + 1e-4, y)))

    from matplotlib.collections import LineCollection

    labels = {
        _C_QUEUE: "queued",
        _C_PREFILL: "waiting for first token",
        _C_DECODE: "decoding",
        _C_TAIL_DECODE: "finished in the tail",
        _C_STRAGGLER: "slowest (stragglers)",
    }
    for colour in (_C_QUEUE, _C_PREFILL, _C_DECODE, _C_TAIL_DECODE, _C_STRAGGLER):
        if colour in segments:
            # Stragglers keep a readable thickness even when 2,000 rows share the height.
            lw = max(width, 2.0) if colour == _C_STRAGGLER else width
            ax.add_collection(
                LineCollection(
                    segments[colour],
                    colors=colour,
                    linewidths=lw,
                    capstyle="butt",
                    zorder=3 if lw > width else 2,
                )
            )
    truncated = [
        (r["finish_ns"] / 1e9, y)
        for y, r in enumerate(rows)
        if r.get("finish_reason") == FINISH_LENGTH
    ]
    if truncated:
        xs, ys = zip(*truncated, strict=False)
        ax.scatter(
            xs,
            ys,
            marker="|",
            s=max(4.0, min(60.0, (width * 1.6) ** 2)),
            color=_C_TRUNCATED,
            zorder=3,
            linewidths=1.0 if n > 200 else 1.5,
        )

    # Name what the step waited for: the last finisher and the slowest, with their trace ids.
    last = len(rows) - 1
    by_latency = sorted(range(n), key=lambda i: rows[i]["arrival_ns"] - rows[i]["finish_ns"])
    noted = [last] + [i for i in by_latency if i in straggler_rows and i != last]
    for k, y in enumerate(noted[: 3 if n > 40 else 8]):
        r = rows[y]
        tokens = r.get("output_tokens")
        note = f"{'last ' if y == last else ''}{(r['finish_ns'] - r['arrival_ns']) / 1e9:.2f} s"
        if tokens is not None:
            note += f", {tokens} tok"
        if r.get("trace_id"):
            note += f", trace {r['trace_id'][:8]}…"
        ax.annotate(
            note,
            (r["finish_ns"] / 1e9, y),
            xytext=(4, 0 if n <= 40 else 12 * k),
            textcoords="offset points",
            va="center",
            fontsize=8,
            color=_C_STRAGGLER,
            zorder=4,
            arrowprops=None
            if n <= 40 or k == 0
            else {"arrowstyle": "-", "color": _C_STRAGGLER, "lw": 0.5},
        )

    ax.set_xlim(0, end * 1.16 if end > 0 else 1)
    pad = 0.5 if n <= 40 else n * 0.015
    ax.set_ylim(-pad, n - 1 + pad)
    ax.invert_yaxis()  # the first to finish at the top, the tail at the bottom
    ax.set_xlabel("seconds since the step's first request arrived")
    ax.set_ylabel("requests, in order of finish")
    if n <= 40:
        ax.set_yticks(range(n))
        ax.set_yticklabels([str(r.get("output_tokens", "")) for r in rows], fontsize=7)
        ax.set_ylabel("requests in order of finish (label: output tokens)")
    ax.grid(axis="x", color="#eeeeee", zorder=0)
    # Patches, not the collections themselves: a 0.6 pt line is invisible in a legend.
    from matplotlib.patches import Patch

    handles = [
        Patch(
            color=_C_TAIL_SPAN,
            label=f"tail: {stats['tail_duration_s']:.2f} s, {stats['tail_requests']} requests",
        )
    ]
    handles += [Patch(color=c, label=labels[c]) for c in labels if c in segments]
    if truncated:
        handles.append(Patch(color=_C_TRUNCATED, label="hit max_tokens (tick at finish)"))
    ax.legend(handles=handles, loc="upper right", fontsize=8, framealpha=0.9)
    ax.set_title("Request waterfall", fontsize=10, loc="left")


def _histogram(ax: Axes, requests: list[dict[str, Any]], stats: Mapping[str, Any]) -> None:
    """Response lengths, split by whether max_tokens cut them: the tail's cause, at a glance."""
    stopped = [r["output_tokens"] or 0 for r in requests if r.get("finish_reason") != FINISH_LENGTH]
    cut = [r["output_tokens"] or 0 for r in requests if r.get("finish_reason") == FINISH_LENGTH]
    values = stopped + cut
    if not values:
        ax.text(0.5, 0.5, "no lengths", ha="center", va="center", transform=ax.transAxes)
        return
    top = max(values)
    bins = max(1, min(40, top + 1 if top < 40 else 40))
    ax.hist(
        [stopped, cut],
        bins=bins,
        range=(0, max(1, top)),
        stacked=True,
        color=[_C_DECODE, _C_TRUNCATED],
        label=["stopped", "hit max_tokens"],
        edgecolor="white",
        linewidth=0.4,
    )
    for key, style in (
        ("output_tokens_p50", ":"),
        ("output_tokens_p90", "--"),
        ("output_tokens_max", "-"),
    ):
        ax.axvline(
            stats[key],
            color="#333333",
            ls=style,
            lw=1,
            label=f"{key.rsplit('_', 1)[1]} {stats[key]}",
        )
    ax.set_xlabel("output tokens")
    ax.set_ylabel("requests")
    ax.legend(fontsize=8)
    ax.set_title("Response length", fontsize=10, loc="left")
