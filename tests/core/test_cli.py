"""``otel-rollout check`` as a launcher would run it: a subprocess and its exit status."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from otel_rollout.config import CAPTURE_CONTENT_ENV


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("OTEL_ROLLOUT_") and k != CAPTURE_CONTENT_ENV
    }
    env.update(extra)
    return env


def _commands() -> list[list[str]]:
    commands = [[sys.executable, "-m", "otel_rollout.cli", "check"]]
    script = Path(sys.executable).with_name("otel-rollout")
    if script.exists():
        commands.append([str(script), "check"])
    return commands


@pytest.mark.parametrize("command", _commands(), ids=lambda c: Path(c[0]).name)
def test_check_ok(command: list[str]) -> None:
    result = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "configuration ok" in result.stdout
    assert "OTEL_ROLLOUT_LATENCY_BUCKETS" in result.stdout
    assert result.stderr.strip() == ""


@pytest.mark.parametrize("command", _commands(), ids=lambda c: Path(c[0]).name)
def test_check_fails_naming_the_variable(command: list[str]) -> None:
    result = subprocess.run(
        command,
        env=_env(OTEL_ROLLOUT_TAIL_QUANTILE="1.5", OTEL_ROLLOUT_STEP_SUMMARY="loud"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "OTEL_ROLLOUT_TAIL_QUANTILE='1.5'" in result.stderr
    assert "OTEL_ROLLOUT_STEP_SUMMARY='loud'" in result.stderr
    assert (
        "invalid configuration: OTEL_ROLLOUT_TAIL_QUANTILE, OTEL_ROLLOUT_STEP_SUMMARY"
        in result.stderr
    )
    assert "configuration ok" not in result.stdout


def test_check_empty_value_is_ok() -> None:
    result = subprocess.run(
        _commands()[0],
        env=_env(OTEL_ROLLOUT_LATENCY_BUCKETS=""),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_check_names_output_paths_where_nothing_can_be_written(tmp_path: Path) -> None:
    a_file = tmp_path / "plain-file"
    a_file.write_text("x")
    result = subprocess.run(
        _commands()[0],
        env=_env(
            OTEL_ROLLOUT_STEP_LOG=str(tmp_path),  # a directory, not a file
            OTEL_ROLLOUT_REPORT_DIR=str(a_file / "pngs"),
        ),  # below a file: cannot be created
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert f"OTEL_ROLLOUT_STEP_LOG={str(tmp_path)!r} is invalid (is a directory)" in result.stderr
    assert "OTEL_ROLLOUT_REPORT_DIR=" in result.stderr and "cannot be created" in result.stderr
    assert "invalid configuration: OTEL_ROLLOUT_STEP_LOG, OTEL_ROLLOUT_REPORT_DIR" in result.stderr


def test_check_accepts_output_paths_that_can_be_created(tmp_path: Path) -> None:
    result = subprocess.run(
        _commands()[0],
        env=_env(
            OTEL_ROLLOUT_STEP_LOG=str(tmp_path / "new" / "steps.jsonl"),
            OTEL_ROLLOUT_REPORT_DIR=str(tmp_path / "pngs"),
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_check_probes_paths_for_real_even_as_root(tmp_path: Path) -> None:
    """``os.access`` says yes to root for /proc; the check must try, and leave nothing behind."""
    result = subprocess.run(
        _commands()[0],
        env=_env(
            OTEL_ROLLOUT_STEP_LOG="/proc/otel-rollout-probe/steps.jsonl",
            OTEL_ROLLOUT_REPORT_DIR="/proc/otel-rollout-probe-pngs",
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "OTEL_ROLLOUT_STEP_LOG='/proc/otel-rollout-probe/steps.jsonl' is invalid" in (
        result.stderr
    )
    assert "OTEL_ROLLOUT_REPORT_DIR='/proc/otel-rollout-probe-pngs' is invalid" in result.stderr
    # a path that can be made: accepted, and the probe removed what it created
    ok = subprocess.run(
        _commands()[0],
        env=_env(
            OTEL_ROLLOUT_STEP_LOG=str(tmp_path / "a" / "b" / "steps.jsonl"),
            OTEL_ROLLOUT_REPORT_DIR=str(tmp_path / "pngs"),
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert list(tmp_path.iterdir()) == []
    existing = tmp_path / "steps.jsonl"
    existing.write_text("{}\n")
    subprocess.run(
        _commands()[0],
        env=_env(OTEL_ROLLOUT_STEP_LOG=str(existing)),
        check=True,
        timeout=60,
        capture_output=True,
    )
    assert existing.read_text() == "{}\n"  # appended to nothing, never truncated
