"""The docs name what the code reads and emits, and nothing else.

- every ``OTEL_ROLLOUT_*`` variable that appears in ``otel_rollout/`` is a row of the README's
  settings table, and every one the docs mention is read by the code (or is a development
  variable of scripts/ and tests/): a removed setting cannot linger in a doc;
- every metric, span and attribute name in the README's "What it emits" section is one the code
  emits (a value in ``otel_rollout/semconv.py`` or a GenAI/error semconv constant the emitter
  uses), and every such name is in that section.
"""

from __future__ import annotations

import re
from pathlib import Path

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics
from opentelemetry.semconv.attributes import error_attributes

from otel_rollout import semconv
from otel_rollout.config import RETIRED

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
_SETTING = re.compile(r"OTEL_ROLLOUT_[A-Z0-9_]*[A-Z0-9]")
_DOTTED = re.compile(r"^[a-z][a-z0-9_]*(?:\.(?:[a-z0-9_]+|<key>|<name>))+$")
_NOT_EMITTED = {semconv.BAGGAGE_STEP_KEY}
"""semconv names that are not span or metric names: the baggage key an open step travels under."""
_PHASE_TOTAL = f"{semconv.STEP_ATTR_PHASE_PREFIX}<name>{semconv.STEP_ATTR_PHASE_SUFFIX}"
_TEMPLATES = {
    f"{semconv.ROLLOUT_STEP_ATTRIBUTE_PREFIX}<key>": {semconv.ROLLOUT_STEP_ATTRIBUTE_PREFIX},
    _PHASE_TOTAL: {semconv.STEP_ATTR_PHASE_PREFIX, semconv.STEP_ATTR_PHASE_SUFFIX},
    f"{semconv.PHASE_SPAN_NAME} <name>": {semconv.PHASE_SPAN_NAME},
}
"""Names written with a placeholder in the README, and the semconv fragments they are built of."""


def _names_in(paths: list[Path]) -> set[str]:
    return {m for path in paths for m in _SETTING.findall(path.read_text(errors="replace"))}


def _settings_rows() -> set[str]:
    return {
        line.split("|")[1].strip().strip("`")
        for line in README.read_text().splitlines()
        if line.startswith("| `OTEL_")
    }


def test_every_setting_the_code_reads_is_in_the_readme_table() -> None:
    in_code = _names_in(sorted((REPO / "otel_rollout").rglob("*.py")))
    assert in_code, "no OTEL_ROLLOUT_* name found in otel_rollout/"
    missing = in_code - _settings_rows() - set(RETIRED)  # a retired name is reported, not read
    assert not missing, f"settings the code reads but README's table lacks: {sorted(missing)}"


def test_docs_mention_no_setting_the_code_does_not_read() -> None:
    docs = [README, *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md"]
    known = _names_in(sorted((REPO / "otel_rollout").rglob("*.py")))
    development = _names_in(
        [
            p
            for d in ("scripts", "tests", "testkit")
            for p in (REPO / d).rglob("*")
            if p.is_file() and p.suffix in ("", ".py", ".sh")
        ]
    )
    stale = {
        (doc.relative_to(REPO).as_posix(), name)
        for doc in docs
        for name in _names_in([doc])
        if name not in known | development
    }
    assert not stale, f"docs mention settings nothing reads: {sorted(stale)}"


def _emitted() -> set[str]:
    """Every name the emitter can write: ours (semconv.py) and the GenAI/error ones it uses."""
    ours = {v for k, v in vars(semconv).items() if k.isupper() and isinstance(v, str)}
    source = "\n".join(p.read_text() for p in sorted((REPO / "otel_rollout").rglob("*.py")))
    used = set()
    for module, alias in (
        (gen_ai_attributes, "GenAI"),
        (gen_ai_metrics, "gen_ai_metrics"),
        (error_attributes, "error_attributes"),
    ):
        for constant in re.findall(rf"\b{alias}\.([A-Z_]+)\b", source):
            used.add(getattr(module, constant))
    assert "gen_ai.server.request.duration" in used and "error.type" in used
    return ours | used


def _emit_section() -> str:
    text = README.read_text()
    start = text.index("## What it emits")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def _names_in_tables(section: str) -> set[str]:
    names = set()
    for line in section.splitlines():
        if line.startswith("|"):
            names |= {t for t in re.findall(r"`([^`]+)`", line) if _DOTTED.match(t)}
    return names


def test_every_name_in_the_emit_tables_is_emitted() -> None:
    section = _emit_section()
    names = _names_in_tables(section)
    assert len(names) >= 40, f"emit tables look truncated: {sorted(names)}"
    emitted = _emitted()
    unknown = set()
    for name in names:
        if "<" in name:
            if name not in _TEMPLATES:
                unknown.add(name)
        elif name not in emitted:
            unknown.add(name)
    assert not unknown, f"README's emit tables name what the code never emits: {sorted(unknown)}"


def test_every_emitted_name_is_in_the_emit_section() -> None:
    section = _emit_section()
    documented = _names_in_tables(section) | {t for t in re.findall(r"`([^`]+)`", section)}
    fragments = {f for t, parts in _TEMPLATES.items() if t in documented for f in parts}
    undocumented = {n for n in _emitted() - _NOT_EMITTED if n not in documented | fragments}
    assert not undocumented, (
        f"emitted but missing from README's 'What it emits': {sorted(undocumented)}"
    )


def test_the_check_catches_a_name_the_code_does_not_emit() -> None:
    """Control: the table parser finds names, and an invented one is not in the emitted set."""
    fake = "| `rollout.step.tail_seconds` | double | x |\n| `rollout.step.<key>` | any | y |"
    assert _names_in_tables(fake) == {"rollout.step.tail_seconds", "rollout.step.<key>"}
    assert "rollout.step.tail_seconds" not in _emitted()


def test_the_readme_vllm_matrix_is_the_one_the_compat_suites_assert() -> None:
    """README's version × timing table is generated from testkit/vllm_matrix.py, the table
    the compat suites hold each release to: a change there must reach the README."""
    from testkit.vllm_matrix import markdown_table

    text = README.read_text()
    begin, end = "<!-- vllm-matrix:begin -->\n", "<!-- vllm-matrix:end -->"
    assert begin in text and end in text
    block = text.split(begin, 1)[1].split(end, 1)[0]
    assert block == markdown_table(), (
        "README's vLLM matrix differs from testkit/vllm_matrix.py: paste markdown_table()"
    )
