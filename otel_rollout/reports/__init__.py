"""Step reports for people without a tracing backend: terminal summary, JSON step log, PNG.

Reports read a step's analysis and records; they never make telemetry and never touch the OTel
SDK, so the CLI can render a log on a machine that never ran an engine.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from otel_rollout.analysis import StepStats
from otel_rollout.config import RolloutConfig
from otel_rollout.guard import PROCESS
from otel_rollout.record import RequestRecord, TrajectoryRecord
from otel_rollout.reports.summary import format_summary

__all__ = ["format_summary", "publish"]


def publish(
    step: int | None,
    stats: StepStats,
    records: Sequence[RequestRecord],
    config: RolloutConfig,
    trajectories: Sequence[TrajectoryRecord] = (),
    phases: Sequence[tuple[str, int, int]] = (),
) -> None:
    """Everything the configuration asks for at a step's end: summary, log line, PNG.

    ``phases`` are the step's top-level phases as ``(name, start_ns, end_ns)``.
    """
    if config.step_summary:
        print(format_summary(step, stats, phases), file=sys.stderr, flush=True)
    if not (config.step_log or config.report_dir):
        return
    from otel_rollout.reports import steplog

    entry = steplog.step_entry(step, stats, records, trajectories, phases)
    if config.step_log:
        steplog.append_step_log(config.step_log, entry)
    if config.report_dir:
        from otel_rollout.reports import (
            png,  # matplotlib is optional; only load it when asked
        )

        try:
            png.write_png(entry, config.report_dir)
        except ImportError as exc:
            PROCESS.warn("matplotlib", "otel_rollout: %s; step PNGs are skipped", exc)
