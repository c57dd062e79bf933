"""One torchrun launch of 2 processes on CPU (gloo), with this checkout importable in every rank."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def torchrun(*args: str) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc-per-node 2 ARGS...``: its exit code and captured output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           *args], env=env, capture_output=True, text=True, timeout=300)
