"""compose.yaml, checked structurally (no docker engine here): loopback-only ports, images pinned
in .env, no committed admin password, every mounted file present, header comments everywhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

IMAGE = re.compile(r"^(?P<repo>[\w./-]+):\$\{(?P<var>\w+):\?[^}]*\}$")
EXPECTED_IMAGES = {
    "otel-collector": "otel/opentelemetry-collector-contrib",
    "prometheus": "prom/prometheus",
    "tempo": "grafana/tempo",
    "grafana": "grafana/grafana",
}


@pytest.fixture(scope="module")
def compose(repo_root: Path) -> dict:
    return yaml.safe_load((repo_root / "compose.yaml").read_text())


@pytest.fixture(scope="module")
def pins(repo_root: Path) -> dict[str, str]:
    out = {}
    for line in (repo_root / ".env").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            k, _, v = line.partition("=")
            out[k.strip()] = v.strip()
    return out


def test_services_present(compose: dict) -> None:
    assert set(EXPECTED_IMAGES) <= set(compose["services"])


def test_images_pinned_in_env_file(compose: dict, pins: dict[str, str]) -> None:
    for name, svc in compose["services"].items():
        m = IMAGE.match(svc["image"])
        assert m, (
            f"{name}: image {svc['image']!r} must be <repo>:${{VAR:?...}} with VAR pinned in .env"
        )
        var = m.group("var")
        assert var in pins, f"{name}: {var} is not pinned in .env"
        assert re.fullmatch(r"v?\d+\.\d+\.\d+", pins[var]), (
            f"{var}={pins[var]!r} is not an exact version"
        )
        if name in EXPECTED_IMAGES:
            assert m.group("repo") == EXPECTED_IMAGES[name]


def test_env_file_holds_only_version_pins(pins: dict[str, str]) -> None:
    assert pins and all(k.endswith("_VERSION") for k in pins), (
        f".env must hold version pins only: {sorted(pins)}"
    )


def test_collector_component_list_matches_pin(repo_root: Path, pins: dict[str, str]) -> None:
    version = pins["OTELCOL_CONTRIB_VERSION"]
    assert (repo_root / "tests/data" / f"otelcol-contrib-{version}-components.yaml").exists()


def test_ports_bound_to_loopback(compose: dict) -> None:
    published = 0
    for name, svc in compose["services"].items():
        for port in svc.get("ports") or []:
            assert isinstance(port, str) and port.startswith("127.0.0.1:"), (
                f"{name}: port {port!r} not on 127.0.0.1"
            )
            published += 1
    assert published >= 5
    assert "127.0.0.1:4317:4317" in compose["services"]["otel-collector"]["ports"]
    assert "127.0.0.1:4318:4318" in compose["services"]["otel-collector"]["ports"]


def test_no_default_admin_password(compose: dict, repo_root: Path) -> None:
    env = compose["services"]["grafana"]["environment"]
    assert re.fullmatch(
        r"\$\{GF_SECURITY_ADMIN_PASSWORD:\?[^}]+\}", env["GF_SECURITY_ADMIN_PASSWORD"]
    )
    assert "PASSWORD" not in (repo_root / ".env").read_text().replace(
        "GF_SECURITY_ADMIN_PASSWORD in your shell", ""
    )
    assert str(env.get("GF_AUTH_ANONYMOUS_ENABLED", "false")).lower() == "false"


def test_bind_mounts_exist(compose: dict, repo_root: Path) -> None:
    named = set(compose.get("volumes") or {})
    for name, svc in compose["services"].items():
        for vol in svc.get("volumes") or []:
            source = vol.split(":", 1)[0]
            if source.startswith("."):
                assert (repo_root / source).exists(), (
                    f"{name}: mounted path {source} does not exist"
                )
            else:
                assert source in named, (
                    f"{name}: volume {source!r} is neither a path nor a declared volume"
                )


def test_provisioning_mounted_as_is(compose: dict) -> None:
    vols = compose["services"]["grafana"]["volumes"]
    assert "./grafana/provisioning:/etc/grafana/provisioning:ro" in vols
    collector = compose["services"]["otel-collector"]
    assert "./collector/otelcol.yaml:/etc/otelcol-contrib/config.yaml:ro" in collector["volumes"]
    # the tail-sampling overlay is at hand (compose.yaml says how to add it), not on by default
    assert (
        "./collector/tail-sampling.yaml:/etc/otelcol-contrib/tail-sampling.yaml:ro"
        in collector["volumes"]
    )
    assert collector["command"] == ["--config=/etc/otelcol-contrib/config.yaml"]
    prom = compose["services"]["prometheus"]
    assert "./prometheus/rules.yml:/etc/prometheus/rules.yml:ro" in prom["volumes"]
    assert "--enable-feature=exemplar-storage" in prom["command"]
    assert "--web.enable-remote-write-receiver" in prom["command"]
    # exponential histograms reach Prometheus as native histograms (scrape or remote write)
    assert "--enable-feature=native-histograms" in prom["command"]


def test_slow_request_threshold_reaches_collector(compose: dict) -> None:
    env = compose["services"]["otel-collector"]["environment"]
    assert "ROLLOUT_SLOW_REQUEST_MS" in env


CONFIG_FILES = [
    "compose.yaml",
    ".env",
    "collector/otelcol.yaml",
    "collector/multinode/agent.yaml",
    "collector/multinode/gateway.yaml",
    "collector/tail-sampling.yaml",
    "prometheus/prometheus.yml",
    "prometheus/rules.yml",
    "tempo/tempo.yaml",
    "grafana/provisioning/datasources/datasources.yaml",
    "grafana/provisioning/dashboards/dashboards.yaml",
    "tests/pipeline/rules_test.yml",
]


@pytest.mark.parametrize("rel", CONFIG_FILES)
def test_config_file_opens_with_header_comment(repo_root: Path, rel: str) -> None:
    first = (repo_root / rel).read_text().splitlines()[0]
    assert first.startswith("#") and len(first) > 20, f"{rel} must open with a header comment"


def test_every_config_file_is_listed(repo_root: Path) -> None:
    found = {
        p.relative_to(repo_root).as_posix()
        for d in ("collector", "grafana/provisioning")
        for p in (repo_root / d).rglob("*.y*ml")
    }
    assert found <= set(CONFIG_FILES), (
        f"add new config files to CONFIG_FILES: {sorted(found - set(CONFIG_FILES))}"
    )


def test_tempo_config(repo_root: Path) -> None:
    cfg = yaml.safe_load((repo_root / "tempo/tempo.yaml").read_text())
    assert cfg["storage"]["trace"]["backend"] == "local"
    assert cfg["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(
        ":4317"
    )
    assert cfg["server"]["http_listen_port"] == 3200
    procs = cfg["overrides"]["defaults"]["metrics_generator"]["processors"]
    assert "span-metrics" not in procs, "span metrics after sampling would be biased"
    assert (
        cfg["metrics_generator"]["storage"]["remote_write"][0]["url"]
        == "http://prometheus:9090/api/v1/write"
    )
