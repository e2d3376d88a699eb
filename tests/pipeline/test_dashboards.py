"""Grafana: the committed dashboards are exactly what grafana/dashboards_src produces, their
queries are well formed (TraceQL parsed by Grafana's own grammar under node), and the
provisioned datasources link to each other by uid."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from pipeline_tools import parse_traceql

from testkit.promql import _panels, all_promql_expressions, all_traceql_queries

PROM_UID = "rollout-prometheus"
TEMPO_UID = "rollout-tempo"


def _load_builder(repo: Path) -> ModuleType:
    path = repo / "grafana" / "dashboards_src" / "build_dashboards.py"
    spec = importlib.util.spec_from_file_location("otel_rollout_build_dashboards", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:
        pytest.fail(
            f"{exc}: install the pinned SDK: pip install 'grafana-foundation-sdk==1769699379!11.6.0'",
            pytrace=False,
        )
    return module


@pytest.fixture(scope="module")
def dashboards(repo_root: Path) -> dict[str, dict]:
    return {
        p.name: json.loads(p.read_text())
        for p in sorted((repo_root / "grafana/dashboards").glob("*.json"))
    }


@pytest.fixture(scope="module")
def datasources(repo_root: Path) -> dict[str, dict]:
    doc = yaml.safe_load(
        (repo_root / "grafana/provisioning/datasources/datasources.yaml").read_text()
    )
    return {ds["uid"]: ds for ds in doc["datasources"]}


def test_committed_json_is_exactly_what_the_code_produces(repo_root: Path) -> None:
    rendered = _load_builder(repo_root).render()
    committed = {p.name: p.read_text() for p in (repo_root / "grafana/dashboards").glob("*.json")}
    assert set(committed) == set(rendered), (
        "grafana/dashboards/ holds files the builder does not produce"
    )
    for name, text in rendered.items():
        assert committed[name] == text, (
            f"grafana/dashboards/{name} is stale: run python grafana/dashboards_src/build_dashboards.py"
        )


def test_foundation_sdk_is_the_pinned_build() -> None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("grafana-foundation-sdk")
    except PackageNotFoundError:
        pytest.fail("pip install 'grafana-foundation-sdk==1769699379!11.6.0'", pytrace=False)
    assert installed == "1769699379!11.6.0", (
        "a plain install picks the Grafana 10.1 build; pin the epoch"
    )


def test_every_target_has_ref_id_and_known_datasource(
    dashboards: dict[str, dict], datasources: dict[str, dict]
) -> None:
    for name, dash in dashboards.items():
        for panel in _panels(dash["panels"]):
            if panel["type"] == "row":
                continue
            targets = panel.get("targets") or []
            assert targets, f"{name}: panel {panel.get('title')!r} has no query"
            ref_ids = [t.get("refId") for t in targets]
            assert all(ref_ids) and len(set(ref_ids)) == len(ref_ids), (
                f"{name}: {panel['title']!r} refIds {ref_ids}"
            )
            for obj in (panel, *targets):
                ds = obj.get("datasource")
                if ds:
                    assert (
                        ds["uid"] in datasources and datasources[ds["uid"]]["type"] == ds["type"]
                    ), f"{name}: {panel['title']!r} uses unknown datasource {ds}"
        for v in dash["templating"]["list"]:
            if v.get("datasource"):
                assert v["datasource"]["uid"] in datasources


def test_long_tail_dashboard_content(dashboards: dict[str, dict]) -> None:
    dash = dashboards["rollout-long-tail.json"]
    assert dash["title"] == "Rollout long tail" and dash["uid"] == "rollout-long-tail"
    assert {"model", "provider", "service", "replica"} <= {
        v["name"] for v in dash["templating"]["list"]
    }
    panels = [p for p in _panels(dash["panels"]) if p["type"] != "row"]
    heatmaps = [p for p in panels if p["type"] == "heatmap"]
    assert len(heatmaps) >= 2 and all(
        t.get("exemplar") is True for p in heatmaps for t in p["targets"]
    )
    exprs = " ".join(t.get("expr", "") for p in panels for t in p["targets"])
    for metric in (
        "gen_ai_server_request_duration_seconds_bucket",
        "gen_ai_client_token_usage_bucket",
        "gen_ai_client_inference_operation_output_tokens_bucket",  # gen_ai_latest_experimental
        "gen_ai_client_inference_usage_output_tokens_total",
        "rollout_step_tail_duration_seconds",
        "rollout_step_straggler_ratio",
        "rollout_step_tail_requests",
        "rollout_step_idle_capacity_seconds",
        "rollout_requests_active",
        "rollout_engine_idle_time_seconds_total",
        "rollout_engine_busy_time_seconds_total",
        "rollout_engine_held_time_seconds_total",
        "rollout_engine_silence_seconds",
        "rollout_requests_oldest_age_seconds",
        'rollout_phase_name="weight_sync"',
        "rollout_step_staleness",
        "rollout_finish_reason",
        'rollout_finish_reason="length"',
    ):
        assert metric in exprs, f"dashboard never queries {metric}"
    for q in ("0.5", "0.9", "0.99"):
        assert f"histogram_quantile({q}," in exprs
    tempo_tables = [
        p for p in panels if p["type"] == "table" and p["datasource"]["uid"] == TEMPO_UID
    ]
    assert tempo_tables and all(
        t["queryType"] == "traceql" for p in tempo_tables for t in p["targets"]
    )
    assert any("duration >" in t["query"] for p in tempo_tables for t in p["targets"])


def test_traceql_queries_parse_with_grafana_grammar(repo_root: Path) -> None:
    queries = all_traceql_queries(repo_root)
    assert queries
    # The parser must also reject a broken query, or "no error node" proves nothing.
    control = "{ span.gen_ai.provider.name != && duration > }"
    results = parse_traceql([q for _, q in queries] + [control])
    assert results[-1]["ok"] is False, "the TraceQL parser accepted a broken control query"
    bad = [(src, r) for (src, _), r in zip(queries, results[:-1], strict=False) if not r["ok"]]
    assert not bad, f"TraceQL that Grafana's grammar rejects: {bad}"


def test_promql_placeholders_all_substituted(repo_root: Path) -> None:
    exprs = all_promql_expressions(repo_root)
    assert exprs and all("$" not in e for _, e in exprs)


def test_datasources_link_to_each_other(datasources: dict[str, dict], repo_root: Path) -> None:
    assert (
        (repo_root / "grafana/provisioning/datasources/datasources.yaml")
        .read_text()
        .startswith("#")
    )
    prom, tempo = datasources[PROM_UID], datasources[TEMPO_UID]
    assert prom["type"] == "prometheus" and tempo["type"] == "tempo"
    dest = prom["jsonData"]["exemplarTraceIdDestinations"]
    assert any(d["datasourceUid"] == TEMPO_UID and d["name"] == "trace_id" for d in dest)
    tj = tempo["jsonData"]
    assert tj["tracesToMetrics"]["datasourceUid"] == PROM_UID and tj["tracesToMetrics"]["queries"]
    assert tj["serviceMap"]["datasourceUid"] == PROM_UID
    assert tj["search"]["hide"] is False
    assert prom["url"] == "http://prometheus:9090" and tempo["url"] == "http://tempo:3200"


def test_dashboard_provider_matches_compose_mount(repo_root: Path) -> None:
    text = (repo_root / "grafana/provisioning/dashboards/dashboards.yaml").read_text()
    assert text.startswith("#")
    provider = yaml.safe_load(text)["providers"][0]
    compose = yaml.safe_load((repo_root / "compose.yaml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./grafana/dashboards:{provider['options']['path']}:ro" in mounts


# --- "Slowest requests" lists request spans only ------------------------------------------------

_CLAUSE = re.compile(
    r'^(name|duration|span\.[\w.]+)\s*(!=|=~|!~|>=|<=|=|>|<)\s*(nil|"[^"]*"|\d+(?:ns|ms|s|m|h)?)$'
)
_UNITS_NS = {"ns": 1, "ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}


def _spanset_filter(query: str) -> Callable[[Any], bool]:
    """A predicate for the query's spanset filter ``{ a && b && … }`` over SDK spans.

    Covers exactly the conjunctions of comparisons the shipped tables use; anything else raises,
    so a rewritten query cannot slip past this check unevaluated.
    """
    body = query[query.index("{") + 1 : query.index("}")]
    clauses = []
    for raw in body.split("&&"):
        match = _CLAUSE.match(raw.strip())
        assert match, f"clause this check does not understand: {raw.strip()!r}"
        clauses.append(match.groups())

    def value(lhs: str, span: Any) -> Any:
        if lhs == "name":
            return span.name
        if lhs == "duration":
            return span.end_time - span.start_time
        return span.attributes.get(lhs[len("span.") :])

    def literal(rhs: str) -> Any:
        if rhs == "nil":
            return None
        if rhs.startswith('"'):
            return rhs[1:-1]
        if rhs.isdigit():
            return int(rhs)
        number, unit = re.match(r"(\d+)(\D+)", rhs).groups()  # type: ignore[union-attr]
        return int(number) * _UNITS_NS[unit]

    def holds(span: Any) -> bool:
        for lhs, op, rhs in clauses:
            left, right = value(lhs, span), literal(rhs)
            if op == "!=" and not (left != right):
                return False
            if op == "=" and not (left == right):
                return False
            if op in ("=~", "!~"):
                found = left is not None and re.fullmatch(right, str(left)) is not None
                if found != (op == "=~"):
                    return False
            if op in (">", ">=", "<", "<="):
                if (
                    left is None
                    or not {
                        ">": left > right,
                        ">=": left >= right,
                        "<": left < right,
                        "<=": left <= right,
                    }[op]
                ):
                    return False
        return True

    return holds


def test_slowest_requests_table_lists_request_spans_only(dashboards: dict[str, dict]) -> None:
    """Real spans from the emitter (a step, a batch under it, requests under that), run through
    the table's filter: the batch and step spans, always the longest, must not be listed."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_rollout.config import RolloutConfig
    from otel_rollout.steps import StepScope
    from otel_rollout.telemetry import Telemetry
    from testkit.records import make_record

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = Telemetry(
        "vllm",
        tracer_provider.get_tracer("dashboards"),
        MeterProvider().get_meter("dashboards"),
        RolloutConfig(),
    )
    with StepScope(3, config=RolloutConfig(), telemetry=telemetry):
        with telemetry.batch("tiny", "text_completion", 2) as ctx:
            telemetry.emit(make_record("tiny", request_id="r1"), ctx)
            telemetry.emit(make_record("tiny", request_id="r2", error=RuntimeError("boom")), ctx)
    telemetry.flush()  # request spans are made on the background emitter
    spans = exporter.get_finished_spans()
    assert {s.name for s in spans} == {"rollout.step", "rollout.batch", "text_completion tiny"}

    panels = [
        p
        for d in dashboards.values()
        for p in _panels(d["panels"])
        if p["type"] == "table" and p.get("title", "").startswith("Slowest requests")
    ]
    assert panels, "no 'Slowest requests' table"
    for panel in panels:
        for target in panel["targets"]:
            query = target["query"].replace("$model", ".*").replace("$min_duration", "0s")
            listed = [s for s in spans if _spanset_filter(query)(s)]
            assert sorted(s.attributes.get("gen_ai.response.id") for s in listed) == ["r1", "r2"], (
                f"{target['query']} lists {[s.name for s in listed]}"
            )


def test_trajectory_row_and_the_step_link(dashboards: dict[str, dict]) -> None:
    """The trajectory heatmap has exemplars, and the trajectory tables and the Explore link,
    run over real spans of two steps, list exactly the trajectory spans they name."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_rollout.config import RolloutConfig
    from otel_rollout.steps import StepScope
    from otel_rollout.telemetry import Telemetry, step_telemetry
    from otel_rollout.trajectories import TrajectoryScope, rollout_tool
    from testkit.promql import explore_traceql
    from testkit.records import make_record

    dash = dashboards["rollout-long-tail.json"]
    panels = [p for p in _panels(dash["panels"]) if p["type"] != "row"]
    (traj_heatmap,) = [
        p for p in panels if p["type"] == "heatmap" and "rollout_trajectory_duration" in str(p)
    ]
    assert all(t["exemplar"] is True for t in traj_heatmap["targets"])
    exprs = " ".join(t.get("expr", "") for p in panels for t in p["targets"])
    for metric in ("rollout_trajectory_turns", "rollout_step_trajectory_tool_share_sum"):
        assert metric in exprs

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter_provider = MeterProvider()
    telemetry = Telemetry(
        "vllm",
        tracer_provider.get_tracer("dashboards"),
        meter_provider.get_meter("d"),
        RolloutConfig(),
    )
    steps = step_telemetry(tracer_provider, meter_provider)
    for step in (1, 2):
        with StepScope(step, config=RolloutConfig(), telemetry=steps):
            for sample in range(2):
                with TrajectoryScope("coder", sample_id=f"{step}-{sample}", telemetry=steps):
                    telemetry.emit(make_record("tiny", request_id=f"r{step}{sample}"))
                    with rollout_tool("python"):
                        pass
    telemetry.flush()
    spans = exporter.get_finished_spans()
    assert sum(1 for s in spans if s.name == "invoke_agent coder") == 4

    def listed(query: str, step: str) -> list[str]:
        query = query.replace("$step", step).replace("$min_duration", "0s")
        return sorted(
            str(s.attributes["rollout.trajectory.sample_id"])
            for s in spans
            if _spanset_filter(query)(s)
        )

    (by_step,) = [p for p in panels if p["type"] == "table" and "of step $step" in p["title"]]
    assert listed(by_step["targets"][0]["query"], "2") == ["2-0", "2-1"]
    (slow,) = [p for p in panels if p["type"] == "table" and p["title"].startswith("Trajectories")]
    assert listed(slow["targets"][0]["query"], "1") == ["1-0", "1-1", "2-0", "2-1"]
    (link,) = [link for link in dash["links"] if "trajectories" in link["title"]]
    (query,) = explore_traceql(link["url"])
    assert listed(query, "1") == ["1-0", "1-1"]
