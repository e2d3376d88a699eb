"""A real Prometheus (Debian's 2.42) on loopback for tests: start, query, stop.

Fails loudly when the binary is missing, as every pipeline tool does. ``native=True`` adds
``--enable-feature=native-histograms``: Prometheus then asks targets for the protobuf exposition
and stores exponential histograms as native histograms (2.42 keeps no classic series beside
them: ``scrape_classic_histograms`` arrived in 2.45).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

HINT = "apt-get install -y --no-install-recommends prometheus (Debian's 2.42, as CI installs it)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    def __init__(
        self,
        tmp: Path,
        target_port: int,
        *,
        native: bool = False,
        rule_files: list[str] | None = None,
        job: str = "rollout-e2e",
    ) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail(f"prometheus not found on PATH: {HINT}", pytrace=False)
        self.port = free_port()
        config = tmp / "prometheus.yml"
        config.write_text(
            json.dumps(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": rule_files or [],
                    "scrape_configs": [
                        {
                            "job_name": job,
                            "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}],
                        }
                    ],
                }
            )
        )
        features = "exemplar-storage,native-histograms" if native else "exemplar-storage"
        self.log = tmp / "prometheus.log"
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                f"--enable-feature={features}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("w"),
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"prometheus exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2):
                    return
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        pytest.fail("prometheus did not become ready")

    def api(self, path: str, **params: Any) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[Any]:
        return list(self.api("query", query=expr)["result"])

    def scalar(self, expr: str) -> float:
        (sample,) = self.query(expr)
        return float(sample["value"][1])

    def wait_for(self, expr: str, timeout: float = 30) -> list[Any]:
        """Poll until ``expr`` returns data (scrapes are asynchronous)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.query(expr)
            if result:
                return result
            time.sleep(0.5)
        pytest.fail(f"no data for {expr!r} within {timeout}s")

    def exemplars(self, selector: str) -> list[dict[str, Any]]:
        now = time.time()
        data = self.api("query_exemplars", query=selector, start=now - 3600, end=now + 60)
        return [ex for series in data for ex in series["exemplars"]]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
