"""The terminal view of a step, for users without a metrics stack: one headline, then the stragglers."""

from __future__ import annotations

from collections.abc import Sequence

from otel_rollout.analysis import StepStats, Straggler


def format_summary(
    step: int | None, stats: StepStats, phases: Sequence[tuple[str, int, int]] = ()
) -> str:
    """The step's lines: headline, tail, stragglers, then trajectories, phases and weights where
    the step had them (``phases``: its top-level phases as ``(name, start_ns, end_ns)``)."""
    label = f"step {step}" if step is not None else "step"
    lines = [
        f"[otel_rollout] {label}: {stats.requests} requests in {stats.duration_s:.2f} s | "
        f"latency p50 {stats.latency_p50_s:.2f} s p90 {stats.latency_p90_s:.2f} s "
        f"max {stats.latency_max_s:.2f} s | length p50 {stats.output_tokens_p50} "
        f"p90 {stats.output_tokens_p90} max {stats.output_tokens_max} tokens",
        f"  tail: {stats.tail_duration_s:.2f} s ({stats.tail_fraction:.0%} of the step) after "
        f"{stats.tail_quantile:.0%} had finished, {stats.tail_requests} still running | "
        f"straggler ratio {stats.straggler_ratio:.1f}x | truncated {stats.truncation_ratio:.0%} | "
        f"idle capacity {stats.idle_capacity_s:.2f} request-s ({stats.idle_fraction:.0%})",
    ]
    if (why := format_causes(stats)) is not None:
        lines.append(why)
    if (estimate := format_whatif(stats)) is not None:
        lines.append(estimate)
    for s in stats.stragglers:
        tokens = "?" if s.output_tokens is None else s.output_tokens
        # A request timed by an HTTP client has no span of its own here: the server made it.
        span = f" span_id={s.span_id}" if s.span_id else ""
        lines.append(
            f"  slow: {s.duration_s:8.3f} s {tokens:>6} tokens "
            f"{s.finish_reason or '-':<6}{_phases_of(s)} trace_id={s.trace_id}{span}"
        )
    if (t := stats.trajectories) is not None:
        statuses = " ".join(f"{name} {count}" for name, count in t.statuses.items())
        lines.append(
            f"  trajectories: {t.count} ({statuses}) | turns p50 {t.turns_p50} max {t.turns_max} | "
            f"duration p50 {t.duration_p50_s:.2f} s p90 {t.duration_p90_s:.2f} s "
            f"max {t.duration_max_s:.2f} s | time in generation {t.generation_share:.0%} "
            f"tools {t.tool_share:.0%} scoring {t.scoring_share:.0%}"
        )
        for slow in t.slowest:
            lines.append(
                f"  slow trajectory: {slow.duration_s:8.3f} s {slow.turns:>3} turns "
                f"tools {slow.tool_s:.3f} s {slow.status:<9} trace_id={slow.trace_id} "
                f"span_id={slow.span_id}"
            )
    if (p := stats.request_phases) is not None:
        shown = [
            f"{name} p50 {ph.p50_s:.3f} p90 {ph.p90_s:.3f} max {ph.max_s:.3f} s"
            for name, ph in (("queue", p.queue), ("prefill", p.prefill), ("decode", p.decode))
            if ph is not None
        ]
        lines.append("  request phases: " + " | ".join(shown))
    if (c := stats.cache) is not None:
        lines.append(
            f"  prefix cache: {c.hit_rate:.1%} of {c.prompt_tokens} prompt tokens cached "
            f"({c.cached_tokens} tokens, {c.requests} requests)"
        )
    if (e := stats.engine) is not None:
        hit = (
            ""
            if e.prefix_cache_hit_rate is None
            else f" | prefix hits {e.prefix_cache_hit_rate:.1%}"
        )
        counted = "reads" if e.source == "sampled" else "iterations"
        lines.append(
            f"  engine: {e.iterations} {counted} | KV cache peak {e.kv_cache_usage_peak:.1%} "
            f"mean {e.kv_cache_usage_mean:.1%} | running peak {e.running_peak} waiting peak "
            f"{e.waiting_peak} | {e.generation_tokens} tokens generated "
            f"({e.generation_throughput:.0f}/s) | preempted {e.preemptions}{hit}"
        )
    if stats.preemptions:
        lines.append(
            f"  preemptions: {stats.preemptions} (KV cache full: requests evicted and recomputed)"
        )
    if phases:
        totals: dict[str, float] = {}
        for name, start_ns, end_ns in phases:
            totals[name] = totals.get(name, 0.0) + max(0, end_ns - start_ns) / 1e9
        covered = sum(totals.values())
        parts = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in totals.items())
        lines.append(
            f"  phases: {parts} | unaccounted {max(0.0, stats.duration_s - covered):.2f} s"
        )
    if (w := stats.staleness) is not None:
        lines.append(
            f"  weights: version {w.current} | staleness max {w.max} mean {w.mean:.2f} | "
            f"{w.stale_requests} of {w.requests} requests from older weights"
        )
    return "\n".join(lines)


def _phases_of(s: Straggler) -> str:
    """`` | queue 0.001 prefill 0.020 decode 3.190 s`` where the engine stamped them: why a
    straggler was slow (waiting, a long prompt, or a long answer), and its preemptions."""
    parts = [
        f"{name} {seconds:.3f}"
        for name, seconds in (
            ("queue", s.queue_s),
            ("prefill", s.prefill_s),
            ("decode", s.decode_s),
        )
        if seconds is not None
    ]
    text = f" | {' '.join(parts)} s" if parts else ""
    if s.preemptions:
        text += f" | preempted {s.preemptions}x"
    return text + " |" if text else ""


def format_causes(stats: StepStats, shown: int = 4) -> str | None:
    """``why: 71 % length_bound (the last request: 256 tokens, median 31, hit max_tokens), …``:
    the step's largest causes (:mod:`otel_rollout.attribution`), those of 1 % or more."""
    causes = stats.causes
    if causes is None:
        return None
    ranked = sorted(causes.share.items(), key=lambda kv: kv[1], reverse=True)
    parts = []
    for cause, share in ranked[:shown]:
        if share < 0.01:
            break
        part = f"{share:.0%} {cause}"
        c = causes.critical
        if cause == "length_bound" and c.output_tokens is not None:
            hit = ", hit max_tokens" if c.finish_reason == "length" else ""
            part += (
                f" (the last request: {c.output_tokens} tokens, "
                f"median {c.median_output_tokens}{hit})"
            )
        elif cause == "replica_imbalance" and stats.replicas is not None:
            busiest = stats.replicas.busiest
            part += (
                f" ({busiest.replica} ended {stats.replicas.spread_s:.2f} s after the first of "
                f"{stats.replicas.count} replicas, with {busiest.requests} requests)"
            )
        parts.append(part)
    if not parts:
        return None
    preempted = causes.critical.preemptions
    note = f" | the last request was preempted {preempted}x" if preempted else ""
    return "  why: " + ", ".join(parts) + note


_SHOWN_S = 0.005
"""A saving that prints as ``0.00 s`` is not shown."""


def format_whatif(stats: StepStats) -> str | None:
    """``what if (estimates): max_tokens=143 (p95) → 0.31 s sooner, 3 cut | stop at 90 % →
    0.31 s sooner, 6 lost``: only the changes that would have saved anything."""
    estimate = stats.whatif
    if estimate is None:
        return None
    parts = [
        f"max_tokens={c.tokens} (p{round(c.quantile * 100)}) → {c.saved_s:.2f} s sooner, "
        f"{c.truncated} cut"
        for c in estimate.caps
        if c.saved_s >= _SHOWN_S
    ]
    parts += [
        f"stop at {s.quantile:.0%} → {s.saved_s:.2f} s sooner, {s.lost} lost"
        for s in estimate.stops
        if s.saved_s >= _SHOWN_S
    ]
    balance = estimate.balance
    if balance is not None and balance.saved_s >= _SHOWN_S:
        parts.append(f"balanced replicas → {balance.saved_s:.2f} s sooner")
    if balance is not None and balance.fewest < balance.replicas:
        parts.append(f"{balance.fewest} of {balance.replicas} replicas would have sufficed")
    return "  what if (estimates): " + " | ".join(parts) if parts else None
