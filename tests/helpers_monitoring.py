"""Prometheus and promtool for the monitoring tests: Debian's binaries that `make monitoring-tools` unpacks into
.tools/prometheus/ (or a folder named by LPX_PROMETHEUS_BIN); a test skips, naming the fix, without them.
`prometheus_server` runs a real Prometheus on 127.0.0.1 with a scrape config and rule files."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".tools" / "prometheus" / "usr" / "bin"


def tool(name: str) -> Path:
    """promtool or prometheus; skips the test when neither LPX_PROMETHEUS_BIN, .tools nor PATH has it."""
    for folder in (os.environ.get("LPX_PROMETHEUS_BIN"), str(BIN)):
        if folder and (Path(folder) / name).is_file():
            return Path(folder) / name
    found = shutil.which(name)
    if found:
        return Path(found)
    pytest.skip(f"{name} not found: run 'make monitoring-tools' (Debian's prometheus package into .tools/)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """A running Prometheus: `query` an instant PromQL expression, get [(labels, value)]."""

    def __init__(self, url: str, process: subprocess.Popen) -> None:
        self.url, self.process = url, process

    def query(self, expr: str) -> list[tuple[dict, float]]:
        params = urllib.parse.urlencode({"query": expr})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{self.url}/api/v1/query?{params}", timeout=10) as resp:
            answer = json.loads(resp.read())
        assert answer["status"] == "success", answer
        return [(r["metric"], float(r["value"][1])) for r in answer["data"]["result"]]

    def value(self, expr: str) -> float | None:
        """The largest value of an instant query; None when it returns nothing."""
        got = [v for _, v in self.query(expr)]
        return max(got) if got else None


def prometheus_server(folder: Path, targets: list[str], rule_files: list[Path], labels: dict[str, str]):
    """Generator for a fixture: Prometheus scraping `targets` every second with `labels` on every series,
    evaluating `rule_files` every second; stopped (its process, by pid) afterwards."""
    binary = tool("prometheus")
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {"job_name": "lpx", "static_configs": [{"targets": targets, "labels": labels}]},
        ],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = open(folder / "prometheus.log", "w")
    process = subprocess.Popen(
        [
            str(binary),
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                opener.open(f"{url}/-/ready", timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(
                        f"Prometheus did not start: {(folder / 'prometheus.log').read_text()[-2000:]}"
                    )
                time.sleep(0.2)
        yield Prometheus(url, process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()
