"""Structural checks of the OpenTelemetry Collector configs in collector/.

No collector binary can run here, so each config is checked against the component list of the
pinned otelcol-contrib release (tests/data/otelcol-contrib-<version>-components.yaml) and for
the properties the rollout pipeline depends on (sampling policies, exemplars, trace-id routing).
The tail-sampling overlay is checked merged over each base the way the Collector merges several
``--config`` sources (confmap: maps merge key by key, any other value, a list included, is
replaced whole).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from collector_schema import config_errors
from collector_schema import errors as schema_errors

KINDS = ("receivers", "processors", "exporters", "connectors", "extensions")
SUFFIX = {
    "receivers": "receiver",
    "processors": "processor",
    "exporters": "exporter",
    "connectors": "connector",
    "extensions": "extension",
}
# Config type names that are not simply the module name minus its kind suffix.
IRREGULAR = {
    "memorylimiterprocessor": "memory_limiter",
    "tailsamplingprocessor": "tail_sampling",
    "probabilisticsamplerprocessor": "probabilistic_sampler",
    "healthcheckextension": "health_check",
    "filestorage": "file_storage",
    "dbstorage": "db_storage",
}
OVERLAY = "collector/tail-sampling.yaml"
CONFIGS = [
    "collector/otelcol.yaml",
    "collector/multinode/agent.yaml",
    "collector/multinode/gateway.yaml",
    f"collector/otelcol.yaml+{OVERLAY}",
    f"collector/multinode/gateway.yaml+{OVERLAY}",
]
ENV_REF = re.compile(r"^\$\{env:(?P<name>\w+)(?::-(?P<default>[^}]*))?\}$")


def _env_pins(repo: Path) -> dict[str, str]:
    pins = {}
    for line in (repo / ".env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            k, _, v = line.partition("=")
            pins[k.strip()] = v.strip()
    return pins


@pytest.fixture(scope="module")
def contrib_components(repo_root: Path) -> dict[str, set[str]]:
    version = _env_pins(repo_root)["OTELCOL_CONTRIB_VERSION"]
    path = repo_root / "tests" / "data" / f"otelcol-contrib-{version}-components.yaml"
    assert path.exists(), f"no component list for the pinned otelcol-contrib {version}: {path}"
    data = yaml.safe_load(path.read_text())
    assert str(data["version"]) == version
    out: dict[str, set[str]] = {}
    for kind in KINDS:
        names = set()
        for module in data[kind]:
            names.add(IRREGULAR.get(module, module.removesuffix(SUFFIX[kind])))
        out[kind] = names
    return out


def _merge(base: dict, overlay: dict) -> dict:
    """confmap's merge of two ``--config`` sources: maps key by key, anything else replaced."""
    out = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _load(repo: Path, rel: str) -> dict:
    """One config, or ``a.yaml+b.yaml``: b merged over a, as ``--config a --config b``."""
    merged: dict = {}
    for part in rel.split("+"):
        merged = _merge(merged, yaml.safe_load((repo / part).read_text()))
    return merged


def test_merge_is_confmaps() -> None:
    base = {"p": {"a": {"x": 1}, "b": [1, 2]}, "s": {"pl": {"t": {"procs": ["m", "b"]}}}}
    overlay = {"p": {"c": {}, "b": [3]}, "s": {"pl": {"t": {"procs": ["m", "ts", "b"]}}}}
    assert _merge(base, overlay) == {
        "p": {"a": {"x": 1}, "b": [3], "c": {}},
        "s": {"pl": {"t": {"procs": ["m", "ts", "b"]}}},
    }


def _type(component_id: str) -> str:
    return component_id.split("/", 1)[0]


def _env_default(value: object) -> str:
    """The value a `${env:X:-default}` reference takes when X is unset (or the plain value)."""
    m = ENV_REF.match(str(value))
    if m:
        assert m.group("default") is not None, f"{value} has no default"
        return m.group("default")
    return str(value)


def _seconds(duration: str) -> float:
    total = 0.0
    for num, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", duration):
        total += float(num) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    return total


@pytest.mark.parametrize("rel", CONFIGS)
def test_components_exist_in_pinned_contrib(
    repo_root: Path, contrib_components: dict[str, set[str]], rel: str
) -> None:
    cfg = _load(repo_root, rel)
    for kind in KINDS:
        for cid in cfg.get(kind) or {}:
            assert _type(cid) in contrib_components[kind], (
                f"{rel}: {kind[:-1]} {cid!r} is not in otelcol-contrib's component list"
            )


@pytest.mark.parametrize("rel", CONFIGS)
def test_pipelines_reference_defined_components_and_all_are_used(repo_root: Path, rel: str) -> None:
    cfg = _load(repo_root, rel)
    service = cfg["service"]
    defined = {kind: set(cfg.get(kind) or {}) for kind in KINDS}
    used = {kind: set() for kind in KINDS}
    connectors_as_exporter: set[str] = set()
    connectors_as_receiver: set[str] = set()
    pipelines = service["pipelines"]
    assert pipelines, f"{rel}: no pipelines"
    for name, p in pipelines.items():
        assert _type(name) in ("traces", "metrics", "logs"), (
            f"{rel}: pipeline {name!r} has no signal type"
        )
        assert p.get("receivers") and p.get("exporters"), (
            f"{rel}: pipeline {name} lacks receivers or exporters"
        )
        for r in p["receivers"]:
            if r in defined["connectors"]:
                connectors_as_receiver.add(r)
                used["connectors"].add(r)
            else:
                assert r in defined["receivers"], (
                    f"{rel}: pipeline {name} uses undefined receiver {r!r}"
                )
                used["receivers"].add(r)
        for proc in p.get("processors") or []:
            assert proc in defined["processors"], (
                f"{rel}: pipeline {name} uses undefined processor {proc!r}"
            )
            used["processors"].add(proc)
        for e in p["exporters"]:
            if e in defined["connectors"]:
                connectors_as_exporter.add(e)
                used["connectors"].add(e)
            else:
                assert e in defined["exporters"], (
                    f"{rel}: pipeline {name} uses undefined exporter {e!r}"
                )
                used["exporters"].add(e)
    for ext in service.get("extensions") or []:
        assert ext in defined["extensions"], f"{rel}: service uses undefined extension {ext!r}"
        used["extensions"].add(ext)
    for kind in KINDS:
        unused = defined[kind] - used[kind]
        assert not unused, f"{rel}: {kind} defined but never used: {sorted(unused)}"
    assert connectors_as_exporter == connectors_as_receiver == defined["connectors"], (
        f"{rel}: every connector must be an exporter of one pipeline and a receiver of another"
    )


@pytest.mark.parametrize("rel", CONFIGS)
def test_memory_limiter_first_and_batch_everywhere(repo_root: Path, rel: str) -> None:
    cfg = _load(repo_root, rel)
    connectors = set(cfg.get("connectors") or {})
    for name, p in cfg["service"]["pipelines"].items():
        procs = p.get("processors") or []
        assert procs and _type(procs[0]) == "memory_limiter", (
            f"{rel}: pipeline {name} must start with memory_limiter"
        )
        if any(e not in connectors for e in p["exporters"]):
            assert any(_type(x) == "batch" for x in procs), (
                f"{rel}: pipeline {name} exports without batch"
            )
            if "tail_sampling" in procs:
                assert procs.index("tail_sampling") < procs.index("batch"), (
                    f"{rel}: batch after sampling"
                )


@pytest.mark.parametrize("rel", [*CONFIGS[:3], OVERLAY])
def test_header_comment(repo_root: Path, rel: str) -> None:
    assert (repo_root / rel).read_text().startswith("#"), f"{rel} must open with a header comment"


def test_otlp_receiver_grpc_and_http(repo_root: Path) -> None:
    for rel in ("collector/otelcol.yaml", "collector/multinode/agent.yaml"):
        protocols = _load(repo_root, rel)["receivers"]["otlp"]["protocols"]
        assert {"grpc", "http"} <= set(protocols), rel
        assert protocols["grpc"]["endpoint"].endswith(":4317") and protocols["http"][
            "endpoint"
        ].endswith(":4318")


def _tail_sampling(repo: Path) -> dict:
    return _load(repo, OVERLAY)["processors"]["tail_sampling"]


def test_tail_sampling_policies(repo_root: Path) -> None:
    ts = _tail_sampling(repo_root)
    # decision_wait: sized for steps that run for minutes.
    assert _seconds(_env_default(ts["decision_wait"])) >= 300
    policies = {p["type"]: p for p in ts["policies"]}

    latency = policies["latency"]["latency"]["threshold_ms"]
    m = ENV_REF.match(str(latency))
    assert m and m.group("name") == "ROLLOUT_SLOW_REQUEST_MS" and int(m.group("default")) > 0

    assert policies["status_code"]["status_code"]["status_codes"] == ["ERROR"]

    prob = policies["probabilistic"]["probabilistic"]["sampling_percentage"]
    assert 0 < float(_env_default(prob)) < 100

    cond = policies["ottl_condition"]["ottl_condition"]["span"]
    assert len(cond) == 1
    m = re.fullmatch(
        r'IsMatch\(attributes\["gen_ai\.response\.finish_reasons"\], "(?P<lit>(?:[^"\\]|\\.)*)"\)',
        cond[0],
    )
    assert m, f"unexpected truncation condition {cond[0]!r}"
    # OTTL string literal -> regex; the collector turns "$$" into "$" before OTTL sees it.
    pattern = re.compile(m.group("lit").replace('\\"', '"').replace("$$", "$"))
    # IsMatch JSON-encodes a string-array attribute (pcommon.Slice), and sees a plain string as is.
    for value, kept in (
        (["length"], True),
        (["stop", "length"], True),
        (["stop"], False),
        (["lengthy"], False),
        ("length", True),
        ("stop", False),
    ):
        text = json.dumps(value, separators=(",", ":")) if isinstance(value, list) else value
        assert bool(pattern.search(text)) is kept, (value, pattern.pattern)


@pytest.mark.parametrize("base", ["collector/otelcol.yaml", "collector/multinode/gateway.yaml"])
def test_no_tail_sampling_by_default_and_the_overlay_adds_it(repo_root: Path, base: str) -> None:
    """otel_rollout samples per step (OTEL_ROLLOUT_SAMPLE_RATE), so the bases hold no trace for
    a decision wait; the overlay puts the tail sampler into the traces pipeline to Tempo, the same
    in both bases, and changes nothing else of the base's pipelines."""
    plain, merged = _load(repo_root, base), _load(repo_root, f"{base}+{OVERLAY}")
    assert "tail_sampling" not in (plain.get("processors") or {})
    for cfg, sampled in ((plain, False), (merged, True)):
        names = _pipelines_with(cfg, "otlp/tempo", "exporters")
        assert names == ["traces/sampled"]
        procs = cfg["service"]["pipelines"]["traces/sampled"]["processors"]
        assert ("tail_sampling" in procs) is sampled
        assert [p for p in procs if p != "tail_sampling"] == plain["service"]["pipelines"][
            "traces/sampled"
        ]["processors"]
    overlay = _load(repo_root, OVERLAY)
    assert set(overlay) == {"processors", "service"} and set(overlay["processors"]) == {
        "tail_sampling"
    }
    assert overlay["service"] == {
        "pipelines": {
            "traces/sampled": {"processors": ["memory_limiter", "tail_sampling", "batch"]}
        }
    }
    processors = {k: v for k, v in merged["processors"].items() if k != "tail_sampling"}
    assert dict(merged, processors=processors, service=plain["service"]) == plain


def test_headers_explain_the_sampling(repo_root: Path) -> None:
    def header(rel: str) -> str:
        text = (repo_root / rel).read_text()
        return "".join(line for line in text.splitlines(True) if line.startswith("#"))

    overlay = header(OVERLAY)
    assert "decision_wait" in overlay and "memory" in overlay and "minutes" in overlay
    for rel in ("collector/otelcol.yaml", "collector/multinode/gateway.yaml"):
        assert "OTEL_ROLLOUT_SAMPLE_RATE" in header(rel) and "tail-sampling.yaml" in header(rel)


def _pipelines_with(cfg: dict, component: str, role: str) -> list[str]:
    return [n for n, p in cfg["service"]["pipelines"].items() if component in (p.get(role) or [])]


def test_spanmetrics_before_sampling_with_exemplars(repo_root: Path) -> None:
    for rel in (
        "collector/otelcol.yaml",
        f"collector/otelcol.yaml+{OVERLAY}",
        "collector/multinode/agent.yaml",
    ):
        cfg = _load(repo_root, rel)
        sm = cfg["connectors"]["spanmetrics"]
        assert sm["exemplars"]["enabled"] is True
        for name in _pipelines_with(cfg, "spanmetrics", "exporters"):
            p = cfg["service"]["pipelines"][name]
            assert "tail_sampling" not in (p.get("processors") or []), (
                f"{rel}: span metrics after sampling"
            )
            assert p["receivers"] == ["otlp"], f"{rel}: span metrics must see every span received"


def test_metrics_to_prometheus_with_exemplars(repo_root: Path) -> None:
    for rel in ("collector/otelcol.yaml", "collector/multinode/agent.yaml"):
        cfg = _load(repo_root, rel)
        prom = cfg["exporters"]["prometheus"]
        assert prom["enable_open_metrics"] is True, f"{rel}: exemplars need OpenMetrics"
        assert prom["endpoint"].endswith(":8889")
        assert _pipelines_with(cfg, "prometheus", "exporters"), rel


def test_traces_to_tempo(repo_root: Path) -> None:
    for rel in ("collector/otelcol.yaml", "collector/multinode/gateway.yaml"):
        cfg = _load(repo_root, rel)
        exp = cfg["exporters"]["otlp/tempo"]
        assert "tempo:4317" in _env_default(exp["endpoint"])
        assert _pipelines_with(cfg, "otlp/tempo", "exporters"), rel


def test_agent_routes_by_trace_id_and_does_not_sample(repo_root: Path) -> None:
    cfg = _load(repo_root, "collector/multinode/agent.yaml")
    lb = cfg["exporters"]["loadbalancing"]
    assert lb["routing_key"] == "traceID"
    assert "otlp" in lb["protocol"] and "endpoint" not in lb["protocol"]["otlp"]
    assert lb["resolver"]["dns"]["hostname"]
    assert "tail_sampling" not in (cfg.get("processors") or {})
    traces = _pipelines_with(cfg, "loadbalancing", "exporters")
    assert traces and all(_type(n) == "traces" for n in traces)
    gw = _load(repo_root, "collector/multinode/gateway.yaml")
    assert gw["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(":4317")


def test_exponential_histograms_remote_written_as_native_histograms(repo_root: Path) -> None:
    """0.136's prometheus exporter drops exponential histograms; remote write carries them."""
    for rel in ("collector/otelcol.yaml", "collector/multinode/agent.yaml"):
        cfg = _load(repo_root, rel)
        pipelines = cfg["service"]["pipelines"]
        processors = cfg["processors"]

        def conditions(pipeline: dict, processors: dict = processors) -> list[str]:
            return [
                c
                for p in pipeline["processors"]
                if _type(p) == "filter"
                for c in processors[p]["metrics"]["metric"]
            ]

        (scrape,) = _pipelines_with(cfg, "prometheus", "exporters")
        assert conditions(pipelines[scrape]) == ["type == METRIC_DATA_TYPE_EXPONENTIAL_HISTOGRAM"]
        (native,) = _pipelines_with(cfg, "prometheusremotewrite", "exporters")
        assert pipelines[native]["receivers"] == ["otlp"], f"{rel}: every OTLP metric, once"
        assert conditions(pipelines[native]) == ["type != METRIC_DATA_TYPE_EXPONENTIAL_HISTOGRAM"]
        endpoint = _env_default(cfg["exporters"]["prometheusremotewrite"]["endpoint"])
        assert endpoint.endswith("/api/v1/write"), rel


@pytest.fixture(scope="module")
def contrib_fields(repo_root: Path) -> dict:
    version = _env_pins(repo_root)["OTELCOL_CONTRIB_VERSION"]
    path = repo_root / "tests" / "data" / f"otelcol-contrib-{version}-fields.yaml"
    assert path.exists(), f"no typed field table for the pinned otelcol-contrib {version}: {path}"
    data = yaml.safe_load(path.read_text())
    assert str(data["version"]) == version
    return data


@pytest.mark.parametrize("rel", CONFIGS)
def test_every_field_decodes_into_its_type(repo_root: Path, contrib_fields: dict, rel: str) -> None:
    """What the Collector's own decoder would refuse at start-up: unknown keys, wrong types."""
    assert config_errors(_load(repo_root, rel), contrib_fields) == []


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        # issue #40: a YAML integer where the field is a string stops the agent
        ({"resolver": {"dns": {"port": 4317}}}, "resolver.dns.port: 4317 (int)"),
        ({"resolver": {"dns": {"interval": 10}}}, "does not decode into duration"),
        ({"resolver": {"dns": {"ttl": "10s"}}}, "resolver.dns.ttl: not a field"),
        ({"protocol": {"otlp": {"tls": {"insecure": "yes"}}}}, "does not decode into bool"),
        ({"routing_key": ["traceID"]}, "does not decode into string"),
    ],
)
def test_the_typed_check_catches_what_the_collector_refuses(
    repo_root: Path, contrib_fields: dict, patch: dict, expected: str
) -> None:
    cfg = _load(repo_root, "collector/multinode/agent.yaml")
    cfg["exporters"]["loadbalancing"] = _merge(cfg["exporters"]["loadbalancing"], patch)
    found = config_errors(cfg, contrib_fields)
    assert len(found) == 1 and expected in found[0], found


def test_env_defaults_decode_as_the_collector_expands_them(contrib_fields: dict) -> None:
    ts = contrib_fields["processors"]["tail_sampling"]
    good = {"num_traces": "${env:N:-200000}", "decision_wait": "${env:W:-10m}"}
    assert list(schema_errors("p", ts, good)) == []
    bad = {"num_traces": "${env:N:-lots}", "decision_wait": "${env:W:-600}"}
    assert [e.split(":")[0] for e in schema_errors("p", ts, bad)] == [
        "p.num_traces",
        "p.decision_wait",
    ]
    # a string field keeps an expanded value's text: a number in the default is fine there
    dns = contrib_fields["exporters"]["loadbalancing"]["resolver"]["dns"]
    assert list(schema_errors("d", dns, {"port": "${env:P:-4317}"})) == []


def test_tail_sampler_blocks_instead_of_dropping_undecided_traces(repo_root: Path) -> None:
    """Past num_traces the sampler drops the oldest traces undecided (slow and error ones too)
    unless block_on_overflow (contrib #41546, in the pinned release) holds intake back."""
    ts = _tail_sampling(repo_root)
    assert ts["block_on_overflow"] is True
    header = (repo_root / OVERLAY).read_text()
    assert "decided early" not in header and "block_on_overflow" in header
