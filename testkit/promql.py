"""Every PromQL expression the project ships, ready to run against a real Prometheus.

``all_promql_expressions(repo_root)`` collects the expressions of:
  * the committed dashboards (grafana/dashboards/*.json): panel targets, annotation queries,
    and the selectors inside ``label_values(...)`` / ``query_result(...)`` of query variables;
  * the recording and alerting rules (prometheus/rules.yml);
  * the Tempo datasource's trace-to-metrics queries (grafana/provisioning/datasources/*.yaml).

Grafana placeholders are replaced so the result is plain PromQL:
  $__rate_interval, $__interval  -> 1m       $__range -> 1h
  $__tags (trace-to-metrics)     -> job=~".*"
  any dashboard variable ($model, ${provider}, ${replica:regex}, ...) -> .*
An unknown placeholder raises ValueError, so a new variable cannot slip through unsubstituted.

``all_traceql_queries(repo_root)`` does the same for the TraceQL queries of Tempo targets and of
the dashboards' links into Explore.
Only the standard library and PyYAML are needed; the module has no package-relative imports,
so it can be loaded by path from anywhere.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

BUILTINS = {
    "__rate_interval": "1m",
    "__interval": "1m",
    "__range": "1h",
    "__tags": 'job=~".*"',
}
# TraceQL uses the same placeholder syntax; durations must stay durations there.
TRACEQL_VARIABLE_VALUES = {"min_duration": "30s", "step": "1"}

_PLACEHOLDER = re.compile(r"\$\$?(?:\{(?P<braced>\w+)(?::\w+)?\}|(?P<bare>\w+))")


def _substitute(
    expr: str, variables: set[str], source: str, overrides: dict[str, str] | None = None
) -> str:
    def repl(m: re.Match[str]) -> str:
        name = m.group("braced") or m.group("bare")
        if overrides and name in overrides:
            return overrides[name]
        if name in BUILTINS:
            return BUILTINS[name]
        if name in variables:
            return ".*"
        raise ValueError(f"{source}: unknown placeholder ${name} in {expr!r}")

    return _PLACEHOLDER.sub(repl, expr)


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels") or [])


def _ds_type(obj: dict[str, Any], default: str | None = None) -> str | None:
    ds = obj.get("datasource")
    if isinstance(ds, dict):
        return ds.get("type") or default
    return default


_LABEL_VALUES = re.compile(r"^\s*label_values\((?P<sel>.+),\s*\w+\s*\)\s*$", re.S)
_QUERY_RESULT = re.compile(r"^\s*query_result\((?P<expr>.+)\)\s*$", re.S)


def _dashboard_expressions(path: Path, rel: str) -> list[tuple[str, str]]:
    dash = json.loads(path.read_text())
    templ = (dash.get("templating") or {}).get("list") or []
    variables = {v["name"] for v in templ}
    out: list[tuple[str, str]] = []
    for p in _panels(dash.get("panels") or []):
        panel_type = _ds_type(p)
        for t in p.get("targets") or []:
            if "expr" in t and (_ds_type(t, panel_type) in (None, "prometheus")):
                src = f"{rel}: panel {p.get('title')!r} refId {t.get('refId')}"
                out.append((src, _substitute(t["expr"], variables, src)))
    for a in (dash.get("annotations") or {}).get("list") or []:
        if a.get("expr") and _ds_type(a) == "prometheus":
            src = f"{rel}: annotation {a.get('name')!r}"
            out.append((src, _substitute(a["expr"], variables, src)))
    for v in templ:
        if v.get("type") != "query" or _ds_type(v) != "prometheus":
            continue
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if not q:
            continue
        src = f"{rel}: variable {v['name']!r}"
        m = _LABEL_VALUES.match(q) or _QUERY_RESULT.match(q)
        if m:
            inner = m.groupdict().get("sel") or m.groupdict().get("expr")
            out.append((src, _substitute(inner, variables - {v["name"]}, src)))
    return out


def _rules_expressions(path: Path, rel: str) -> list[tuple[str, str]]:
    doc = yaml.safe_load(path.read_text()) or {}
    out = []
    for group in doc.get("groups") or []:
        for rule in group.get("rules") or []:
            kind = "record" if "record" in rule else "alert"
            src = f"{rel}: {kind} {rule.get(kind)}"
            out.append((src, _substitute(rule["expr"].strip(), set(), src)))
    return out


def _datasource_expressions(path: Path, rel: str) -> list[tuple[str, str]]:
    doc = yaml.safe_load(path.read_text()) or {}
    out = []
    for ds in doc.get("datasources") or []:
        t2m = (ds.get("jsonData") or {}).get("tracesToMetrics") or {}
        for q in t2m.get("queries") or []:
            src = f"{rel}: {ds.get('name')} tracesToMetrics {q.get('name')!r}"
            # Provisioning files escape "$" as "$$"; Grafana reads them as one "$".
            out.append((src, _substitute(q["query"].replace("$$", "$"), set(), src)))
    return out


def all_promql_expressions(repo_root: str | Path) -> list[tuple[str, str]]:
    """(source, expr) for every PromQL expression in the committed dashboards, rules and datasources."""
    root = Path(repo_root)
    out: list[tuple[str, str]] = []
    for path in sorted((root / "grafana" / "dashboards").glob("*.json")):
        out += _dashboard_expressions(path, path.relative_to(root).as_posix())
    for path in sorted((root / "prometheus").glob("*rules*.y*ml")):
        out += _rules_expressions(path, path.relative_to(root).as_posix())
    for path in sorted((root / "grafana" / "provisioning" / "datasources").glob("*.y*ml")):
        out += _datasource_expressions(path, path.relative_to(root).as_posix())
    return out


def all_traceql_queries(repo_root: str | Path) -> list[tuple[str, str]]:
    """(source, query) for every TraceQL query of a Tempo target in the committed dashboards."""
    root = Path(repo_root)
    out: list[tuple[str, str]] = []
    for path in sorted((root / "grafana" / "dashboards").glob("*.json")):
        rel = path.relative_to(root).as_posix()
        dash = json.loads(path.read_text())
        variables = {v["name"] for v in (dash.get("templating") or {}).get("list") or []}
        for p in _panels(dash.get("panels") or []):
            for t in p.get("targets") or []:
                if _ds_type(t, _ds_type(p)) == "tempo" and t.get("query"):
                    src = f"{rel}: panel {p.get('title')!r} refId {t.get('refId')}"
                    out.append(
                        (src, _substitute(t["query"], variables, src, TRACEQL_VARIABLE_VALUES))
                    )
        for link in dash.get("links") or []:
            for query in explore_traceql(link.get("url", "")):
                src = f"{rel}: link {link.get('title')!r}"
                out.append((src, _substitute(query, variables, src, TRACEQL_VARIABLE_VALUES)))
    return out


def explore_traceql(url: str) -> list[str]:
    """The TraceQL queries of a Grafana Explore link (``/explore?panes=<json>``)."""
    from urllib.parse import parse_qs, urlsplit

    parts = urlsplit(url)
    if parts.path != "/explore":
        return []
    out = []
    for pane_json in parse_qs(parts.query).get("panes", []):
        for pane in json.loads(pane_json).values():
            out += [q["query"] for q in pane.get("queries", []) if q.get("queryType") == "traceql"]
    return out


if __name__ == "__main__":
    import sys

    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
    for source, expr in all_promql_expressions(root):
        print(f"{source}\n    {' '.join(expr.split())}")
