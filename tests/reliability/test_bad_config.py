"""Every OTEL_ROLLOUT_* variable fed malformed, negative, empty, huge and unicode values.

In process: exactly one warning naming the variable and the value, and the default used. As a
launcher sees it: ``otel-rollout check`` exits non-zero naming each invalid variable, and zero
when values are empty (empty = unset = default).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from otel_rollout.config import CAPTURE_CONTENT_ENV, SETTINGS, load_config

PATHS = {"OTEL_ROLLOUT_REPORT_DIR", "OTEL_ROLLOUT_STEP_LOG"}  # any non-NUL string is a valid path
TEXT = {"OTEL_ROLLOUT_RUN_ID"}  # a name: any printable text names a run

CASES = {
    "malformed": "fast!?",
    "negative": "-1",
    "empty": "",
    "huge": "9" * 400,  # an integer far out of range; as a float, 1e400 = inf
    "unicode": "ünïcødé→∞",
}


def _invalid(env: str, case: str) -> bool:
    return case != "empty" and env not in PATHS | TEXT


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.env)
def test_value_in_process(setting: object, case: str, caplog: pytest.LogCaptureFixture) -> None:
    env, value = setting.env, CASES[case]  # type: ignore[attr-defined]
    with caplog.at_level(logging.DEBUG, logger="otel_rollout"):
        config = load_config({env: value})
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    if _invalid(env, case):
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        message = warnings[0].getMessage()
        assert env in message and repr(value) in message and "using the default" in message
        assert getattr(config, setting.attr) == setting.default  # type: ignore[attr-defined]
        assert [p.variable for p in config.problems] == [env]
    else:
        assert warnings == [] and config.problems == ()
        if case == "empty":
            assert getattr(config, setting.attr) == setting.default  # type: ignore[attr-defined]


def _check(extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("OTEL_ROLLOUT_") and k != CAPTURE_CONTENT_ENV
    }
    env.update(extra)
    return subprocess.run(
        [sys.executable, "-m", "otel_rollout.cli", "check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("case", list(CASES))
def test_check_names_every_invalid_variable(case: str) -> None:
    value = CASES[case]
    result = _check({s.env: value for s in SETTINGS} | {CAPTURE_CONTENT_ENV: value})
    invalid = [s.env for s in SETTINGS if _invalid(s.env, case)]
    if case != "empty":
        invalid.append(CAPTURE_CONTENT_ENV)
    if case == "huge":  # parses as a path, but no file of a 400-character name can be made
        invalid += ["OTEL_ROLLOUT_STEP_LOG", "OTEL_ROLLOUT_REPORT_DIR"]  # the check probes them
    if not invalid:
        assert result.returncode == 0, result.stderr
        return
    assert result.returncode == 1, result.stdout
    named = result.stderr.splitlines()[-1]
    assert named == "invalid configuration: " + ", ".join(invalid)
    for env in invalid:
        assert f"error: {env}={value!r} is invalid" in result.stderr
    assert "Traceback" not in result.stderr


def test_huge_float_and_bucket_lists_are_rejected(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="otel_rollout"):
        config = load_config(
            {
                "OTEL_ROLLOUT_LATENCY_BUCKETS": "1e400",
                "OTEL_ROLLOUT_TOKEN_BUCKETS": ",".join(map(str, range(1, 5000))),
                "OTEL_ROLLOUT_TAIL_QUANTILE": "1e-400",
            }
        )
    assert {p.variable for p in config.problems} == {
        "OTEL_ROLLOUT_LATENCY_BUCKETS",
        "OTEL_ROLLOUT_TOKEN_BUCKETS",
        "OTEL_ROLLOUT_TAIL_QUANTILE",
    }
    assert len(caplog.records) == 3
