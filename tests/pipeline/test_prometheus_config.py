"""Prometheus config and rules, checked with the real promtool (Debian's prometheus package)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from pipeline_tools import PROMTOOL_HINT, require_tool

from testkit.promql import all_promql_expressions

PROM_DIR = "prometheus"


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    promtool = require_tool("promtool", PROMTOOL_HINT)
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_promtool_check_config(repo_root: Path) -> None:
    proc = _promtool("check", "config", "prometheus.yml", cwd=repo_root / PROM_DIR)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 rule files found" in proc.stdout + proc.stderr


def test_promtool_check_rules(repo_root: Path) -> None:
    proc = _promtool("check", "rules", "rules.yml", cwd=repo_root / PROM_DIR)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_rule_unit_tests(repo_root: Path) -> None:
    proc = _promtool("test", "rules", "tests/pipeline/rules_test.yml", cwd=repo_root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_rule_is_unit_tested(repo_root: Path) -> None:
    rules = yaml.safe_load((repo_root / PROM_DIR / "rules.yml").read_text())
    tests = (repo_root / "tests/pipeline/rules_test.yml").read_text()
    for group in rules["groups"]:
        for rule in group["rules"]:
            name = rule.get("record") or rule.get("alert")
            assert name in tests, f"{name} has no promtool test in tests/pipeline/rules_test.yml"
            if "alert" in rule:
                assert (
                    rule.get("for")
                    and rule["labels"].get("severity")
                    and rule["annotations"].get("summary")
                )


def test_scrape_and_exemplar_settings(repo_root: Path) -> None:
    text = (repo_root / PROM_DIR / "prometheus.yml").read_text()
    cfg = yaml.safe_load(text)
    assert text.startswith("#")
    assert cfg["storage"]["exemplars"]["max_exemplars"] > 0
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    collector = jobs["otel-collector"]
    assert collector["honor_labels"] is True
    assert collector["static_configs"][0]["targets"] == ["otel-collector:8889"]
    # The direct-scrape variant is documented in place, commented out.
    assert "# - job_name: rollout-workers" in text and ":9464" in text


def test_every_shipped_promql_expression_parses(repo_root: Path, tmp_path: Path) -> None:
    exprs = all_promql_expressions(repo_root)
    assert len(exprs) >= 30
    for source, expr in exprs:
        assert "$" not in expr, f"{source}: unsubstituted placeholder in {expr!r}"
    doc = {
        "groups": [
            {
                "name": "shipped-expressions",
                "rules": [
                    {"record": f"check:expr_{i}", "expr": expr} for i, (_, expr) in enumerate(exprs)
                ],
            }
        ]
    }
    path = tmp_path / "exprs.yml"
    path.write_text(yaml.safe_dump(doc))
    proc = _promtool("check", "rules", str(path), cwd=tmp_path)
    if proc.returncode != 0:
        bad = [s for s, e in exprs if f"expr_{exprs.index((s, e))}" in proc.stdout + proc.stderr]
        pytest.fail(f"promtool rejected shipped PromQL {bad}:\n{proc.stdout}\n{proc.stderr}")


def test_expression_sources_cover_dashboards_rules_and_datasources(repo_root: Path) -> None:
    sources = [s for s, _ in all_promql_expressions(repo_root)]
    assert any(s.startswith("grafana/dashboards/") and "panel" in s for s in sources)
    assert any(s.startswith("grafana/dashboards/") and "annotation" in s for s in sources)
    assert any(s.startswith("grafana/dashboards/") and "variable" in s for s in sources)
    assert any(s.startswith("prometheus/rules.yml: record") for s in sources)
    assert any(s.startswith("prometheus/rules.yml: alert") for s in sources)
    assert any("tracesToMetrics" in s for s in sources)


def test_direct_scrape_recipe_covers_every_port_a_worker_may_take(
    repo_root: Path, tmp_path: Path
) -> None:
    """The commented direct-scrape job, uncommented, is a valid config whose targets are the
    ports the endpoint may take (one per process on a node), and it says how to bind for compose."""
    from otel_rollout.exposition import DEFAULT_PORT, PORT_RANGE

    text = (repo_root / PROM_DIR / "prometheus.yml").read_text()
    lines = text.splitlines()
    start = lines.index("  # - job_name: rollout-workers")
    recipe = [line.replace("  # ", "  ", 1) for line in lines[start:] if line.startswith("  #")]
    enabled = "\n".join(lines[:start] + recipe) + "\n"
    cfg = yaml.safe_load(enabled)
    (job,) = [j for j in cfg["scrape_configs"] if j["job_name"] == "rollout-workers"]
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == [
        f"host.docker.internal:{p}" for p in range(DEFAULT_PORT, DEFAULT_PORT + PORT_RANGE)
    ]
    assert "OTEL_EXPORTER_PROMETHEUS_HOST=0.0.0.0" in text
    (tmp_path / "rules.yml").write_text((repo_root / PROM_DIR / "rules.yml").read_text())
    (tmp_path / "prometheus.yml").write_text(enabled)
    proc = _promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
