"""The step log: one JSON line per step, its analytics and every request's timeline.

:func:`step_entry` freezes what a step saw into plain JSON, so the same picture can be drawn live
(``OTEL_ROLLOUT_REPORT_DIR``) or later from the log (``OTEL_ROLLOUT_STEP_LOG`` + ``otel-rollout
report``) on a machine that never ran the engine.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from otel_rollout.analysis import StepStats
from otel_rollout.record import RequestRecord, TrajectoryRecord

_logger = logging.getLogger(__name__)

ENTRY_VERSION = 1
"""Bumped when a field changes meaning, so ``render_log`` can refuse a log it would misdraw."""

_LOG_LOCK = threading.Lock()


def step_entry(
    step: int | None,
    stats: StepStats,
    records: Sequence[RequestRecord],
    trajectories: Sequence[TrajectoryRecord] = (),
    phases: Sequence[tuple[str, int, int]] = (),
) -> dict[str, Any]:
    """One step as plain JSON: its analytics, every request's timeline and every trajectory's.

    Times of requests are nanoseconds relative to the step's first arrival (``t0_unix_ns``), which
    keeps lines short and makes the log diffable across runs; ``t0_unix_ns`` is kept so a request
    can still be found in a tracing backend by time, and each request keeps its span's ids.
    """
    t0 = min((r.arrival_ns for r in records), default=0)
    requests = [
        {
            "arrival_ns": record.arrival_ns - t0,
            "scheduled_ns": None if record.scheduled_ns is None else record.scheduled_ns - t0,
            "first_token_ns": None if record.first_token_ns is None else record.first_token_ns - t0,
            "finish_ns": record.finish_ns - t0,
            "prompt_tokens": record.prompt_tokens,
            "output_tokens": record.output_tokens,
            "max_tokens": record.max_tokens,
            "finish_reason": record.finish_reason,
            "request_id": record.request_id,
            "model": record.model,
            "timing_source": record.timing_source,
            "weight_version": record.weight_version,
            "preemptions": record.preemptions,
            "replica": record.replica,
            "trace_id": record.trace_hex,
            "span_id": record.span_hex,
        }
        for record in records
    ]
    trajectory_entries = [
        {
            "agent": t.agent,
            "start_ns": t.start_ns - t0,
            "end_ns": t.end_ns - t0,
            "status": t.status,
            "turns": [[a - t0, f - t0] for a, f in t.turns],
            "tools": [[a - t0, f - t0] for a, f in t.tools],
            "scoring": [[a - t0, f - t0] for a, f in t.scoring],
            "output_tokens": t.output_tokens,
            "reward": t.reward,
            "trace_id": t.trace_hex,
            "span_id": t.span_hex,
        }
        for t in sorted(trajectories, key=lambda t: t.start_ns)
    ]
    stats_dict = asdict(stats)
    stats_dict["tail_fraction"] = stats.tail_fraction
    stats_dict["tail_start_ns"] = stats.tail_start_ns - t0
    if stats_dict.get("causes"):  # the path in order, relative like every time of the entry
        stats_dict["causes"].pop("path", None)
    trace_ids = {r["trace_id"] for r in requests if r["trace_id"]}
    return {
        "version": ENTRY_VERSION,
        "step": step,
        "t0_unix_ns": t0,
        "trace_id": trace_ids.pop() if len(trace_ids) == 1 else None,
        "stats": stats_dict,
        "requests": requests,
        "trajectories": trajectory_entries,
        "phases": [
            {"name": name, "start_ns": start - t0, "end_ns": end - t0}
            for name, start, end in sorted(phases, key=lambda p: p[1])
        ],
        "causes": [
            {"cause": cause, "start_ns": start - t0, "end_ns": end - t0}
            for start, end, cause in (stats.causes.path if stats.causes is not None else ())
        ],
    }


def append_step_log(path: str | os.PathLike[str], entry: Mapping[str, Any]) -> None:
    """Append ``entry`` as one JSON line.

    One ``write`` of a whole line on an append-mode file, under a lock: steps ending on several
    threads never interleave, and a crash leaves at most one torn last line, which
    :func:`read_log` skips.
    """
    line = json.dumps(entry, separators=(",", ":"), allow_nan=False) + "\n"
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _LOG_LOCK, open(target, "a", encoding="utf-8") as fh:
        fh.write(line)


def read_log(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The entries of a step log; unreadable lines are skipped with a warning, not fatal.

    A training job that was killed mid-write must still have its earlier steps rendered.
    """
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                _logger.warning("otel_rollout: %s line %d is not JSON; skipped", path, number)
                continue
            if not isinstance(entry, dict) or entry.get("version") != ENTRY_VERSION:
                _logger.warning(
                    "otel_rollout: %s line %d is not a version-%d step entry; skipped",
                    path,
                    number,
                    ENTRY_VERSION,
                )
                continue
            yield entry
