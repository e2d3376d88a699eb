"""The docs name what the code reads and emits, and nothing else.

- every ``OTEL_ROLLOUT_*`` variable that appears in ``otel_rollout/`` is a row of the settings
  table (docs/CONFIGURATION.md), and every one the docs mention is read by the code (or is a
  development variable of scripts/ and tests/): a removed setting cannot linger in a doc;
- every metric, span and attribute name in docs/EMITS.md is one the code emits (a value in
  ``otel_rollout/semconv.py`` or a GenAI/error semconv constant the emitter uses), and every such
  name is in it;
- every relative link of the README and docs/ reaches a file, and a heading where it names one;
- the README stays a front door: short, the reference in docs/.
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
CONFIGURATION = REPO / "docs" / "CONFIGURATION.md"
EMITS = REPO / "docs" / "EMITS.md"
ENGINES = REPO / "docs" / "ENGINES.md"
_SETTING = re.compile(r"OTEL_ROLLOUT_[A-Z0-9_]*[A-Z0-9]")
_DOTTED = re.compile(r"^[a-z][a-z0-9_]*(?:\.(?:[a-z0-9_]+|<key>|<name>))+$")
_NOT_EMITTED = {semconv.BAGGAGE_STEP_KEY}
"""semconv names that are not span or metric names: the baggage key an open step travels under."""
_PHASE_TOTAL = f"{semconv.STEP_ATTR_PHASE_PREFIX}<name>{semconv.STEP_ATTR_PHASE_SUFFIX}"
_TEMPLATES = {
    f"{semconv.ROLLOUT_STEP_ATTRIBUTE_PREFIX}<key>": {semconv.ROLLOUT_STEP_ATTRIBUTE_PREFIX},
    _PHASE_TOTAL: {semconv.STEP_ATTR_PHASE_PREFIX, semconv.STEP_ATTR_PHASE_SUFFIX},
    f"{semconv.PHASE_SPAN_NAME} <name>": {semconv.PHASE_SPAN_NAME},
    f"{semconv.STEP_ATTR_WHATIF_PREFIX}<change>.<figure>": {semconv.STEP_ATTR_WHATIF_PREFIX},
    f"{semconv.STEP_ATTR_CAUSE_PREFIX}<cause>{semconv.STEP_ATTR_CAUSE_SUFFIX}": {
        semconv.STEP_ATTR_CAUSE_PREFIX,
        semconv.STEP_ATTR_CAUSE_SUFFIX,
    },
}
"""Names written with a placeholder in the README, and the semconv fragments they are built of."""


def _names_in(paths: list[Path]) -> set[str]:
    return {m for path in paths for m in _SETTING.findall(path.read_text(errors="replace"))}


def _settings_rows() -> set[str]:
    return {
        line.split("|")[1].strip().strip("`")
        for line in CONFIGURATION.read_text().splitlines()
        if line.startswith("| `OTEL_")
    }


def test_every_setting_the_code_reads_is_in_the_readme_table() -> None:
    in_code = _names_in(sorted((REPO / "otel_rollout").rglob("*.py")))
    assert in_code, "no OTEL_ROLLOUT_* name found in otel_rollout/"
    missing = in_code - _settings_rows() - set(RETIRED)  # a retired name is reported, not read
    assert not missing, f"settings the code reads but the settings table lacks: {sorted(missing)}"


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
    return EMITS.read_text()


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
    assert not unknown, f"EMITS.md's tables name what the code never emits: {sorted(unknown)}"


def test_every_emitted_name_is_in_the_emit_section() -> None:
    section = _emit_section()
    documented = _names_in_tables(section) | {t for t in re.findall(r"`([^`]+)`", section)}
    fragments = {f for t, parts in _TEMPLATES.items() if t in documented for f in parts}
    undocumented = {n for n in _emitted() - _NOT_EMITTED if n not in documented | fragments}
    assert not undocumented, f"emitted but missing from docs/EMITS.md: {sorted(undocumented)}"


def test_the_check_catches_a_name_the_code_does_not_emit() -> None:
    """Control: the table parser finds names, and an invented one is not in the emitted set."""
    fake = "| `rollout.step.tail_seconds` | double | x |\n| `rollout.step.<key>` | any | y |"
    assert _names_in_tables(fake) == {"rollout.step.tail_seconds", "rollout.step.<key>"}
    assert "rollout.step.tail_seconds" not in _emitted()


def test_the_docs_vllm_matrix_is_the_one_the_compat_suites_assert() -> None:
    """docs/ENGINES.md's version × timing table is generated from testkit/vllm_matrix.py, the
    table the compat suites hold each release to: a change there must reach the docs."""
    from testkit.vllm_matrix import markdown_table

    text = ENGINES.read_text()
    begin, end = "<!-- vllm-matrix:begin -->\n", "<!-- vllm-matrix:end -->"
    assert begin in text and end in text
    block = text.split(begin, 1)[1].split(end, 1)[0]
    assert block == markdown_table(), (
        "docs/ENGINES.md's vLLM matrix differs from testkit/vllm_matrix.py: paste markdown_table()"
    )


_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^(#+) (.*)")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := _HEADING.match(line)):
            slug = _slug(m.group(2))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def _broken_links(paths: list[Path], root: Path = REPO) -> list[str]:
    broken = []
    for doc in paths:
        for target in _LINK.findall(doc.read_text()):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            where = f"{doc.relative_to(root)}: {target}"
            if not dest.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{where} (no such heading)")
    return broken


def test_every_relative_link_of_the_docs_resolves() -> None:
    docs = [README, *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md"]
    assert _broken_links(docs) == []


def test_the_link_check_finds_a_moved_heading(tmp_path: Path) -> None:
    """Control: a link to a heading that moved to another page, and to a missing file."""
    (tmp_path / "a.md").write_text("# A\n\n## Step-aware sampling: keep `the` stragglers\n")
    doc = tmp_path / "b.md"
    doc.write_text("[x](a.md#step-aware-sampling-keep-the-stragglers) [y](#gone) [z](c.md)\n")
    assert _broken_links([doc], tmp_path) == [
        "b.md: #gone (no such heading)",
        "b.md: c.md (no such file)",
    ]


def test_the_readme_is_a_front_door() -> None:
    """What a new user needs in five minutes; the reference lives in docs/ (#40 item 6)."""
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    for page in ("docs/EMITS.md", "docs/CONFIGURATION.md", "docs/ENGINES.md", "docs/FRAMEWORKS.md"):
        assert f"]({page}" in text, page
    assert "](docs/img/step.png)" in text and (REPO / "docs" / "img" / "step.png").stat().st_size
