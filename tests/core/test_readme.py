"""The settings table (docs/CONFIGURATION.md) is the user's reference: it must list every
setting; the README opens with the two commands."""

from __future__ import annotations

from pathlib import Path

from otel_rollout.config import CAPTURE_CONTENT_ENV, SEMCONV_OPT_IN_ENV, SETTINGS

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_settings_table_documents_every_setting() -> None:
    text = (README.parent / "docs" / "CONFIGURATION.md").read_text()
    rows = {
        line.split("|")[1].strip().strip("`")
        for line in text.splitlines()
        if line.startswith("| `OTEL_")
    }
    assert {s.env for s in SETTINGS} | {CAPTURE_CONTENT_ENV, SEMCONV_OPT_IN_ENV} <= rows


def test_readme_opens_with_the_two_commands() -> None:
    block = README.read_text().split("```")[1]
    commands = [line.split("#")[0].strip() for line in block.splitlines()[1:] if line.strip()]
    assert commands == ["scripts/demo", "scripts/test"]
