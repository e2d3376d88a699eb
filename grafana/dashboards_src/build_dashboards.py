"""Build the otel_rollout Grafana dashboards in code and write them to grafana/dashboards/.

Run from anywhere:  python grafana/dashboards_src/build_dashboards.py
(needs grafana-foundation-sdk==1769699379!11.6.0). The generated JSON is committed;
tests/pipeline/test_dashboards.py checks it is exactly what this script produces.

Label conventions the queries rely on (see docs/PIPELINE.md):
  job       service.name of the worker (collector path) or the scrape job (direct scrape)
  instance  service.instance.id, i.e. the replica (collector path) or host:port (direct scrape)
Datasource uids are the ones provisioned in grafana/provisioning/datasources/datasources.yaml.

Request-level histograms (latency, TTFT, TPOT, queue time, token usage) may arrive as Prometheus
native histograms (exponential, OTEL_ROLLOUT_HISTOGRAMS=exponential, Prometheus with
--enable-feature=native-histograms) or as classic _bucket/_sum/_count series (anything else).
Every query over them asks the native series first and falls back to the classic form with
`or` (see native_or_classic), so the same dashboard works on both and on a mix.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from urllib.parse import quote

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap, prometheus, stat, table, tempo, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models import prometheus as pm
from grafana_foundation_sdk.models import tempo as tm

PROMETHEUS_UID = "rollout-prometheus"
TEMPO_UID = "rollout-tempo"
PROM = dm.DataSourceRef(type_val="prometheus", uid=PROMETHEUS_UID)
TEMPO = dm.DataSourceRef(type_val="tempo", uid=TEMPO_UID)

OUT_DIR = Path(__file__).resolve().parent.parent / "dashboards"

# Matchers shared by every request-level query.
REQ = (
    'gen_ai_request_model=~"$model", gen_ai_provider_name=~"$provider", '
    'job=~"$service", instance=~"$replica"'
)
# Step analytics come from the process that drives the step (the trainer), per service.
STEP = 'job=~"$service"'
# Trajectories (rollout_trajectory) are recorded where the agent loop runs; no engine labels.
TRAJ = 'job=~"$service", instance=~"$replica"'
INVOKE_AGENT = 'span.gen_ai.operation.name = "invoke_agent"'
TRAJECTORY_COLUMNS = (
    "span.gen_ai.agent.name, span.rollout.step, span.rollout.trajectory.turns, "
    "span.rollout.trajectory.tool_s, span.rollout.trajectory.generation_s, "
    "span.rollout.trajectory.reward, span.rollout.trajectory.status"
)
RI = "$__rate_interval"


def prom(
    ref_id: str,
    expr: str,
    legend: str = "",
    *,
    exemplar: bool = False,
    fmt: pm.PromQueryFormat | None = None,
    instant: bool = False,
) -> prometheus.Dataquery:
    q = (
        prometheus.Dataquery()
        .ref_id(ref_id)
        .datasource(PROM)
        .expr(expr)
        .editor_mode(pm.QueryEditorMode.CODE)
    )
    if legend:
        q = q.legend_format(legend)
    if exemplar:
        q = q.exemplar(True)
    if fmt is not None:
        q = q.format(fmt)
    if instant:
        q = q.instant()
    else:
        q = q.range()
    return q


def mean_per_step(metric: str, selector: str = STEP, by: str = "") -> str:
    """Mean of a once-per-step histogram over the steps that ended in the interval."""
    grp = f" by ({by})" if by else ""
    return (
        f"sum{grp} (increase({metric}_sum{{{selector}}}[{RI}]))"
        f" / sum{grp} (increase({metric}_count{{{selector}}}[{RI}]))"
    )


def native_or_classic(native: str, classic: str, on: str | None = None) -> str:
    """``native or classic``: the classic answer only where no native series answered.

    ``on`` is the label list the two sides match on; ``on=""`` (``or on()``) takes the classic
    side only when the native side is empty altogether — needed when the two sides' label sets
    differ (a native histogram has no ``le``), as in heatmaps.
    """
    op = "or" if on is None else f"or on({on})"
    return f"{native} {op} {classic}"


def quantile(q: str, metric: str, selector: str, by: str = "") -> str:
    """histogram_quantile over the native histogram, else over the classic buckets."""
    grp = f" by ({by})" if by else ""
    le = f"{by}, le" if by else "le"
    return native_or_classic(
        f"histogram_quantile({q}, sum{grp} (rate({metric}{{{selector}}}[{RI}])))",
        f"histogram_quantile({q}, sum by ({le}) (rate({metric}_bucket{{{selector}}}[{RI}])))",
    )


def count_rate(metric: str, selector: str, by: str = "") -> str:
    """Observations per second of a request histogram (native count, else _count)."""
    grp = f" by ({by})" if by else ""
    return native_or_classic(
        f"sum{grp} (histogram_count(rate({metric}{{{selector}}}[{RI}])))",
        f"sum{grp} (rate({metric}_count{{{selector}}}[{RI}]))",
    )


def sum_rate(metric: str, selector: str, by: str = "") -> str:
    """Sum of observations per second of a request histogram (native sum, else _sum)."""
    grp = f" by ({by})" if by else ""
    return native_or_classic(
        f"sum{grp} (histogram_sum(rate({metric}{{{selector}}}[{RI}])))",
        f"sum{grp} (rate({metric}_sum{{{selector}}}[{RI}]))",
    )


def heatmap_expr(metric: str, selector: str) -> str:
    """Per-interval histogram for a heatmap: native buckets, else classic ``le`` buckets."""
    return native_or_classic(
        f"sum(increase({metric}{{{selector}}}[{RI}]))",
        f"sum by (le) (increase({metric}_bucket{{{selector}}}[{RI}]))",
        on="",
    )


def output_tokens_heatmap() -> str:
    """Response lengths in either GenAI convention: ``gen_ai.client.token.usage`` (type output),
    else ``gen_ai.client.inference.operation.output_tokens`` (OTEL_SEMCONV_STABILITY_OPT_IN=
    gen_ai_latest_experimental); each native, else classic."""
    default = heatmap_expr("gen_ai_client_token_usage", f'{REQ}, gen_ai_token_type="output"')
    latest = heatmap_expr("gen_ai_client_inference_operation_output_tokens", REQ)
    return f"{default} or on() {latest}"


def token_rate_by_type() -> str:
    """Tokens per second by ``gen_ai_token_type`` in either GenAI convention: the default one's
    histogram sums, else the newest conventions' usage counters, labelled input / output."""
    default = sum_rate("gen_ai_client_token_usage", REQ, by="gen_ai_token_type")
    latest = [
        f"label_replace(sum (rate(gen_ai_client_inference_usage_{kind}_tokens_total{{{REQ}}}"
        f'[{RI}])), "gen_ai_token_type", "{kind}", "", "")'
        for kind in ("input", "output")
    ]
    return " or ".join([default, *latest])


def legend_bottom() -> cb.VizLegendOptions:
    return (
        cb.VizLegendOptions()
        .show_legend(True)
        .display_mode(cm.LegendDisplayMode.LIST)
        .placement(cm.LegendPlacement.BOTTOM)
    )


def ts(
    title: str,
    unit: str,
    *targets: prometheus.Dataquery,
    description: str = "",
    stacked: bool = False,
    percent: bool = False,
    w: int = 12,
    h: int = 8,
) -> timeseries.Panel:
    p = (
        timeseries.Panel()
        .title(title)
        .datasource(PROM)
        .unit(unit)
        .span(w)
        .height(h)
        .legend(legend_bottom())
        .line_width(1)
        .fill_opacity(10)
    )
    if description:
        p = p.description(description)
    if stacked or percent:
        mode = cm.StackingMode.PERCENT if percent else cm.StackingMode.NORMAL
        p = p.stacking(cb.StackingConfig().mode(mode)).fill_opacity(60)
    for t in targets:
        p = p.with_target(t)
    return p


def latency_heatmap(title: str, expr: str, unit: str, description: str) -> heatmap.Panel:
    return (
        heatmap.Panel()
        .title(title)
        .description(description)
        .datasource(PROM)
        .span(12)
        .height(9)
        .with_target(prom("A", expr, "{{le}}", exemplar=True, fmt=pm.PromQueryFormat.HEATMAP))
        .calculate(False)
        .color(
            heatmap.HeatmapColorOptions()
            .mode(hm.HeatmapColorMode.SCHEME)
            .scheme("Oranges")
            .scale(hm.HeatmapColorScale.EXPONENTIAL)
            .exponent(0.5)
            .steps(64)
        )
        .y_axis(heatmap.YAxisConfig().unit(unit))
        .cell_gap(1)
        .show_legend()
        .exemplars_color("rgba(255,0,255,0.7)")
        .mode(cm.TooltipDisplayMode.SINGLE)
        .show_y_histogram()
    )


def variables() -> list[db.QueryVariable | db.CustomVariable | db.TextBoxVariable]:
    def qvar(name: str, label: str, query: str) -> db.QueryVariable:
        return (
            db.QueryVariable(name)
            .label(label)
            .datasource(PROM)
            .query(query)
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dm.VariableSort.ALPHABETICAL_ASC)
        )

    # native series (no suffix) or classic _count: whichever this Prometheus stores
    base = '{__name__=~"gen_ai_server_request_duration_seconds(_count)?"}'

    return [
        qvar("service", "Service", f"label_values({base}, job)"),
        qvar(
            "replica",
            "Replica",
            'label_values({__name__=~"gen_ai_server_request_duration_seconds(_count)?", '
            'job=~"$service"}, instance)',
        ),
        qvar("provider", "Provider", f"label_values({base}, gen_ai_provider_name)"),
        qvar("model", "Model", f"label_values({base}, gen_ai_request_model)"),
        (
            db.TextBoxVariable("step")
            .label("Step (trajectories, TraceQL)")
            .default_value("1")
            .description("The training step whose trajectories the Tempo table lists.")
        ),
        (
            db.CustomVariable("min_duration")
            .label("Slow request (TraceQL)")
            .values("5s,30s,1m,2m,5m")
            .current(dm.VariableOption(selected=True, text="30s", value="30s"))
        ),
    ]


def row_latency(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(db.Row("Request latency and response length"))
    d = d.with_panel(
        latency_heatmap(
            "Request latency (exemplars open the trace)",
            heatmap_expr("gen_ai_server_request_duration_seconds", REQ),
            "s",
            "End-to-end generate latency per request; the long tail is the thin band at the top.",
        )
    )
    d = d.with_panel(
        latency_heatmap(
            "Response length (output tokens)",
            output_tokens_heatmap(),
            "short",
            "Output tokens per request; a length tail drives the latency tail.",
        )
    )

    def quant(q: str) -> str:
        return quantile(q, "gen_ai_server_request_duration_seconds", REQ)

    d = d.with_panel(
        ts(
            "Request latency p50 / p90 / p99 / max",
            "s",
            prom("A", quant("0.5"), "p50"),
            prom("B", quant("0.9"), "p90"),
            prom("C", quant("0.99"), "p99", exemplar=True),
            prom("D", quant("1"), "max (bucket bound)"),
            description="Quantiles from the request-duration histogram (native where stored: buckets a few "
            "percent wide; else the classic buckets); max is the upper bound of the highest "
            "non-empty bucket.",
        )
    )

    def tq(m: str) -> str:
        return quantile("0.9", m, REQ)

    d = d.with_panel(
        ts(
            "Queue time, TTFT and time per output token (p90)",
            "s",
            prom("A", tq("rollout_request_queue_time_seconds"), "queue p90"),
            prom("B", tq("gen_ai_server_time_to_first_token_seconds"), "TTFT p90"),
            prom("C", tq("gen_ai_server_time_per_output_token_seconds"), "TPOT p90"),
        )
    )
    return d


def row_steps(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(db.Row("Per training step: the tail"))
    d = d.with_panel(
        ts(
            "Step duration and its tail",
            "s",
            prom("A", mean_per_step("rollout_step_duration_seconds"), "step"),
            prom(
                "B",
                mean_per_step("rollout_step_tail_duration_seconds"),
                "tail (tail quantile done -> last done)",
            ),
            description="Mean over the steps that ended in each interval (one observation per step). The "
            "tail starts when OTEL_ROLLOUT_TAIL_QUANTILE (0.9 by default) of a step's requests "
            "have finished.",
        )
    )
    d = d.with_panel(
        ts(
            "Straggler ratio (slowest / median latency)",
            "x",
            prom("A", mean_per_step("rollout_step_straggler_ratio"), "straggler ratio"),
        )
    )
    d = d.with_panel(
        ts(
            "Stragglers: requests still running when the tail began",
            "short",
            prom("A", mean_per_step("rollout_step_tail_requests"), "stragglers"),
            prom("B", mean_per_step("rollout_step_requests"), "requests per step"),
            w=8,
        )
    )
    d = d.with_panel(
        ts(
            "Idle capacity while stragglers ran",
            "s",
            prom("A", mean_per_step("rollout_step_idle_capacity_seconds"), "idle request-seconds"),
            w=8,
        )
    )
    d = d.with_panel(
        ts(
            "Idle fraction and truncation ratio per step",
            "percentunit",
            prom("A", mean_per_step("rollout_step_idle_fraction"), "idle fraction"),
            prom("B", mean_per_step("rollout_step_truncation_ratio"), "truncated (length)"),
            w=8,
        )
    )
    d = d.with_panel(
        ts(
            "Output tokens per step: max / p90 / p50",
            "short",
            prom(
                "A",
                mean_per_step("rollout_step_output_tokens", by="rollout_statistic"),
                "{{rollout_statistic}}",
            ),
            w=24,
        )
    )
    d = d.with_panel(
        ts(
            "Phases of a training step: mean duration of each",
            "s",
            prom(
                "A",
                mean_per_step("rollout_step_phase_duration_seconds", by="rollout_phase_name"),
                "{{rollout_phase_name}}",
            ),
            description="rollout.step.phase.duration by phase (rollout_phase, or a framework's own "
            "timers: verl's gen, old_log_prob, update_actor, update_weights, ...): where a "
            "training step's time goes besides generation. Mean over the phases that ended in "
            "each interval; a phase timed twice in a step counts twice.",
            w=24,
        )
    )
    weight_sync = f'{STEP}, rollout_phase_name="weight_sync"'
    d = d.with_panel(
        ts(
            "Weight sync: duration p50 / p90 / max",
            "s",
            prom(
                "A",
                "histogram_quantile(0.5, sum by (le) (rate("
                f"rollout_step_phase_duration_seconds_bucket{{{weight_sync}}}[{RI}])))",
                "p50",
            ),
            prom(
                "B",
                "histogram_quantile(0.9, sum by (le) (rate("
                f"rollout_step_phase_duration_seconds_bucket{{{weight_sync}}}[{RI}])))",
                "p90",
            ),
            prom("C", mean_per_step("rollout_step_phase_duration_seconds", weight_sync), "mean"),
            description="Engine weight updates (vLLM collective_rpc weight RPCs, the weight-"
            "transfer API; SGLang update_weights_from_*; verl's update_weights timer): "
            "rollout.step.phase.duration with rollout.phase.name=weight_sync. The distribution, "
            "not only the mean: a few slow syncs stall the whole step.",
            w=8,
        )
    )
    d = d.with_panel(
        ts(
            "Weight-version staleness per step",
            "short",
            prom(
                "A",
                mean_per_step("rollout_step_staleness", by="rollout_statistic"),
                "{{rollout_statistic}} versions behind",
            ),
            description="rollout.step.staleness: the step's weight version minus the version "
            "that generated each request (fully-async RL). max is the oldest sample the step "
            "trained on; 0 means on-policy.",
            w=8,
        )
    )
    return d


def row_why(d: db.Dashboard) -> db.Dashboard:
    """Why the steps took their time (#42): the causes, what would have helped, the replicas."""
    d = d.with_row(db.Row("Why the steps took their time"))
    d = d.with_panel(
        ts(
            "Step time by cause (mean per step)",
            "s",
            prom(
                "A",
                mean_per_step("rollout_step_cause_duration_seconds", by="rollout_cause"),
                "{{rollout_cause}}",
            ),
            description="rollout.step.cause.duration by rollout.cause: each step's duration cut "
            "along its critical path (the request that finished last) into length_bound, "
            "replica_imbalance, decode, prefill, queue, dispatch, agentic_wait, held, phases, "
            "framework_gap. "
            "Every cause is recorded every step, so the stack is the mean step duration. "
            "docs/OUTPUTS.md explains each cause.",
            stacked=True,
            w=12,
        )
    )
    d = d.with_panel(
        ts(
            "What would have helped: estimated seconds saved per step",
            "s",
            prom(
                "A",
                mean_per_step("rollout_step_whatif_saved_seconds", by="rollout_whatif"),
                "{{rollout_whatif}}",
            ),
            prom("B", mean_per_step("rollout_step_duration_seconds"), "step duration"),
            description="rollout.step.whatif.saved by rollout.whatif, estimates from each step's "
            "own timeline: max_tokens capped at the step's p95/p99 length (cap_p95, cap_p99), a "
            "stop once 90/95 % had finished (stop_90, stop_95), balanced replicas (balanced). "
            "The model and its measured error: docs/OUTPUTS.md.",
            w=12,
        )
    )
    d = d.with_panel(
        ts(
            "Replica spread per step: the latest replica's end minus the earliest's",
            "s",
            prom("A", mean_per_step("rollout_step_replica_spread_seconds"), "spread"),
            prom(
                "B",
                mean_per_step(
                    "rollout_step_cause_duration_seconds",
                    f'{STEP}, rollout_cause="replica_imbalance"',
                ),
                "replica_imbalance (step time)",
            ),
            description="rollout.step.replica.spread, on steps served by two replicas or more "
            "(rollout.replica on each request span): how unevenly the step's work was spread, "
            "beside the step time that waited on one replica alone.",
            w=24,
        )
    )
    return d


def row_inside_engine(d: db.Dashboard) -> db.Dashboard:
    """Why a step was slow, from the engines' own figures (#12): the request phases, prefix-cache
    hits, preemptions and KV-cache pressure of each step."""
    d = d.with_row(db.Row("Inside the engine, per training step"))
    phases = (("A", "queue"), ("B", "prefill"), ("C", "decode"))
    for statistic, title, description in (
        (
            "p90",
            "Request phases per step: p90 of queue / prefill / decode",
            "Where the step's requests spent their time, as the engine stamped it: queue "
            "(arrival -> scheduled), prefill (scheduled -> first token), decode (first token -> "
            "finish). p90 over each step's requests, mean over the steps that ended in each "
            "interval. A long queue says the engine was full; a long prefill, long prompts or "
            "cache misses; a long decode, long answers.",
        ),
        (
            "max",
            "Request phases per step: the slowest request's queue / prefill / decode",
            "The maximum of each phase over each step's requests: what the straggler waited for.",
        ),
    ):
        d = d.with_panel(
            ts(
                title,
                "s",
                *(
                    prom(
                        ref,
                        mean_per_step(
                            f"rollout_step_{phase}_time_seconds",
                            f'{STEP}, rollout_statistic="{statistic}"',
                        ),
                        phase,
                    )
                    for ref, phase in phases
                ),
                description=description,
                w=12,
            )
        )
    d = d.with_panel(
        ts(
            "Prefix-cache hit rate per step",
            "percentunit",
            prom("A", mean_per_step("rollout_step_cache_hit_rate"), "cached / prompt tokens"),
            description="rollout.step.cache_hit_rate: the share of the step's prompt tokens the "
            "engine found in its prefix cache (vLLM num_cached_tokens, SGLang cached_tokens, per "
            "request). GRPO groups share a prompt: a low rate there is lost prefill.",
            w=8,
        )
    )
    d = d.with_panel(
        ts(
            "Preemptions per step",
            "short",
            prom("A", mean_per_step("rollout_step_preemptions"), "preemptions"),
            description="rollout.step.preemptions: times the engine evicted one of the step's "
            "requests (KV cache full) and recomputed it later, as the engine counted them per "
            "request. Any at all usually means the batch outgrew the KV cache.",
            w=8,
        )
    )
    d = d.with_panel(
        ts(
            "KV-cache usage per step: peak / mean",
            "percentunit",
            prom(
                "A",
                mean_per_step("rollout_step_engine_kv_cache_usage", by="rollout_statistic"),
                "{{rollout_statistic}}",
            ),
            description="rollout.step.engine.kv_cache_usage: the engine's own KV-cache usage, "
            "each iteration of the step (vLLM's stat-logger interface, engines with stats on). "
            "A peak near 1 with preemptions: the cache is the bottleneck.",
            w=8,
        )
    )
    return d


def trajectory_table(title: str, query: str, description: str, limit: int) -> table.Panel:
    return (
        table.Panel()
        .title(title)
        .datasource(TEMPO)
        .span(24)
        .height(8)
        .description(description)
        .with_target(
            tempo.TempoQuery()
            .ref_id("A")
            .datasource(TEMPO)
            .query_type("traceql")
            .limit(limit)
            .table_type(tm.SearchTableType.SPANS)
            .query(query)
        )
    )


def row_trajectories(d: db.Dashboard) -> db.Dashboard:
    """Agentic rollouts: one point and one span per trajectory (``rollout_trajectory``)."""
    d = d.with_row(db.Row("Agentic trajectories"))
    d = d.with_panel(
        latency_heatmap(
            "Trajectory duration (exemplars open the trajectory's trace)",
            heatmap_expr("rollout_trajectory_duration_seconds", TRAJ),
            "s",
            "rollout.trajectory.duration: one observation per sample's trajectory (its turns, "
            "tool calls and scoring). A dot is an exemplar: the trajectory span of that bucket.",
        )
    )
    d = d.with_panel(
        ts(
            "Turns per trajectory and tool share of trajectory time",
            "short",
            prom("A", quantile("0.5", "rollout_trajectory_turns", TRAJ), "turns p50"),
            prom("B", quantile("0.9", "rollout_trajectory_turns", TRAJ), "turns p90"),
            prom(
                "C",
                mean_per_step("rollout_step_trajectory_tool_share"),
                "tool share of trajectory time (per step)",
            ),
            description="Turns: engine requests per trajectory. Tool share: per step, the "
            "trajectories' seconds in tool calls over their total seconds "
            "(rollout.step.trajectory.tool_share).",
        )
    )
    d = d.with_panel(
        ts(
            "Trajectories per second by how they ended",
            "short",
            prom(
                "A",
                count_rate(
                    "rollout_trajectory_duration_seconds", TRAJ, by="rollout_trajectory_status"
                ),
                "{{rollout_trajectory_status}}",
            ),
            w=24,
        )
    )
    d = d.with_panel(
        trajectory_table(
            "Slowest trajectories of step $step (sort by Duration; click a trace id)",
            f"{{ {INVOKE_AGENT} && span.rollout.step = $step }} | select({TRAJECTORY_COLUMNS})",
            "Every trajectory span of the step chosen above, with its turns, tool and generation "
            "seconds, reward and status. The step span lists the slowest ones' span ids too "
            "(rollout.step.trajectory.slowest).",
            100,
        )
    )
    d = d.with_panel(
        trajectory_table(
            "Trajectories slower than $min_duration",
            f"{{ {INVOKE_AGENT} && duration > $min_duration }} | select({TRAJECTORY_COLUMNS})",
            "Across steps: the long conversations and slow tools the steps waited on.",
            50,
        )
    )
    return d


def row_engines(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(db.Row("Engines and throughput"))
    d = d.with_panel(
        ts(
            "In-flight requests per replica",
            "short",
            prom(
                "A",
                f"sum by (job, instance) (rollout_requests_active{{{REQ}}})",
                "{{job}} {{instance}}",
            ),
        )
    )
    eng = 'job=~"$service", instance=~"$replica"'
    by = "job, instance, gen_ai_request_model"

    def engine_time(state: str) -> str:
        return f"sum by ({by}) (rate(rollout_engine_{state}_time_seconds_total{{{eng}}}[{RI}]))"

    total = " + ".join(engine_time(state) for state in ("busy", "idle", "held"))
    d = d.with_panel(
        ts(
            "Engine time per replica: generating / held / idle",
            "percentunit",
            *(
                prom(ref, f"{engine_time(state)} / ({total})", f"{label} {{{{instance}}}}")
                for ref, state, label in (
                    ("A", "busy", "generating"),
                    ("B", "held", "held"),
                    ("C", "idle", "idle"),
                )
            ),
            description="Share of each replica's time with requests in flight (generating), held "
            "by an engine operation - weight sync, sleep / wake-up, generation paused or asleep - "
            "(held), and with nothing to do (idle). Held time is not idle capacity: the goodput "
            "picture of a step's engine side.",
            stacked=True,
        )
    )
    d = d.with_panel(
        ts(
            "Stalled or slow: silence and oldest request in flight",
            "s",
            prom(
                "A",
                f"max by ({by}) (rollout_engine_silence_seconds{{{eng}}})",
                "no output {{instance}}",
            ),
            prom(
                "B",
                f"max by ({by}) (rollout_requests_oldest_age_seconds{{{eng}}})",
                "oldest in flight {{instance}}",
            ),
            description="A slow step keeps producing (silence near 0 while the oldest request "
            "ages: a straggler); a stuck one does not (silence grows with it). Past "
            "OTEL_ROLLOUT_STALL_TIMEOUT the process logs a warning and rollout_engine_stalled "
            "turns 1 (alert RolloutEngineStalled). Weight syncs and pauses are not silence.",
        )
    )
    d = d.with_panel(
        ts(
            "Throughput (tokens/s)",
            "short",
            prom(
                "A",
                token_rate_by_type(),
                "{{gen_ai_token_type}} tokens/s",
            ),
            w=12,
        )
    )
    d = d.with_panel(
        ts(
            "Finish-reason mix",
            "percentunit",
            prom(
                "A",
                count_rate(
                    "gen_ai_server_request_duration_seconds", REQ, by="rollout_finish_reason"
                ),
                "{{rollout_finish_reason}}",
            ),
            percent=True,
            w=8,
        )
    )
    d = d.with_panel(
        stat.Panel()
        .title("Truncation rate (finish_reason=length)")
        .datasource(PROM)
        .unit("percentunit")
        .span(4)
        .height(8)
        .decimals(1)
        .with_target(
            prom(
                "A",
                "("
                + count_rate(
                    "gen_ai_server_request_duration_seconds",
                    f'{REQ}, rollout_finish_reason="length"',
                )
                + ")"
                " / (" + count_rate("gen_ai_server_request_duration_seconds", REQ) + ")",
                "truncated",
            )
        )
    )
    return d


def row_traces(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(db.Row("Slowest requests and steps (Tempo)"))
    d = d.with_panel(
        table.Panel()
        .title("Slowest requests (click a trace id to open it)")
        .datasource(TEMPO)
        .span(24)
        .height(10)
        .description(
            "Request spans slower than $min_duration among the traces the collector kept "
            "(it keeps every slow, failed and truncated one). Only request spans carry "
            "rollout.timing.source: the rollout.batch and rollout.step spans above them, "
            "always the longest, are left out."
        )
        .with_target(
            tempo.TempoQuery()
            .ref_id("A")
            .datasource(TEMPO)
            .query_type("traceql")
            .limit(50)
            .table_type(tm.SearchTableType.SPANS)
            .query(
                '{ span.rollout.timing.source != nil && span.gen_ai.request.model =~ "$model" '
                "&& duration > $min_duration } | select(span.gen_ai.request.model, "
                "span.gen_ai.usage.output_tokens, span.gen_ai.response.finish_reasons, span.rollout.step)"
            )
        )
    )
    d = d.with_panel(
        table.Panel()
        .title("Steps with the longest tail")
        .datasource(TEMPO)
        .span(24)
        .height(8)
        .with_target(
            tempo.TempoQuery()
            .ref_id("A")
            .datasource(TEMPO)
            .query_type("traceql")
            .limit(20)
            .table_type(tm.SearchTableType.SPANS)
            .query(
                # step spans only carry this attribute: the name is left out, so the panel finds
                # them under the rl.* opt-in too (rl.loop)
                "{ span.rollout.step.tail.duration_s > 0 } | "
                "select(span.rollout.step, span.rollout.step.tail.duration_s, "
                "span.rollout.step.straggler_ratio, span.rollout.step.tail.requests)"
            )
        )
    )
    return d


def rollout_long_tail() -> dm.Dashboard:
    d = (
        db.Dashboard("Rollout long tail")
        .uid("rollout-long-tail")
        .description(
            "Step-aligned view of the rollout phase: request latency/length tails with exemplars, "
            "per-step tail analytics, engine idleness, and the slowest traces."
        )
        .tags(["otel-rollout", "rollout", "genai"])
        .editable()
        .time("now-3h", "now")
        .refresh("30s")
        .timezone("browser")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
    )
    for v in variables():
        d = d.with_variable(v)
    d = d.annotation(
        db.AnnotationQuery()
        .name("Step ends")
        .datasource(PROM)
        .enable(True)
        .icon_color("rgba(120,120,255,0.6)")
        .expr(f"changes(rollout_step_duration_seconds_count{{{STEP}}}[1m]) > 0")
    )
    d = row_latency(d)
    d = row_steps(d)
    d = row_why(d)
    d = row_engines(d)
    d = row_inside_engine(d)
    d = row_trajectories(d)
    d = row_traces(d)
    d = d.link(
        db.DashboardLink("Slowest trajectories of step $step (Tempo, Explore)")
        .type(dm.DashboardLinkType.LINK)
        .url(explore_url(f"{{ {INVOKE_AGENT} && span.rollout.step = $step }}"))
        .include_vars(False)
        .keep_time(True)
        .target_blank(True)
        .tooltip("TraceQL over the trajectory spans of one step")
    )
    return d.build()


def explore_url(traceql: str) -> str:
    """Grafana Explore on the Tempo datasource with ``traceql`` as the query (``$step`` is kept
    for Grafana to fill in)."""
    pane = {
        "t": {
            "datasource": TEMPO_UID,
            "queries": [
                {
                    "refId": "A",
                    "datasource": {"type": "tempo", "uid": TEMPO_UID},
                    "queryType": "traceql",
                    "query": traceql,
                    "tableType": "spans",
                }
            ],
            "range": {"from": "now-3h", "to": "now"},
        }
    }
    return "/explore?schemaVersion=1&panes=" + quote(
        json.dumps(pane, separators=(",", ":")), safe="$"
    )


DASHBOARDS = {"rollout-long-tail.json": rollout_long_tail}


def render() -> dict[str, str]:
    """File name -> JSON text, exactly as committed."""
    return {
        name: json.dumps(fn(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"
        for name, fn in DASHBOARDS.items()
    }


def main() -> int:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name, text in render().items():
        (OUT_DIR / name).write_text(text)
        print(f"wrote {OUT_DIR / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
