"""One line naming this machine, so that a red test run says where it ran.

    python scripts/machine_line.py
    machine: AMD EPYC, x86_64, 2 cores, CPU capability AVX2 (torch 2.13.0+cpu), Linux 6.8, Python 3.11.7

The CPU capability is torch's (``torch.backends.cpu.get_cpu_capability()``: which SIMD kernels torch runs, and
so how float32 rounds) when torch is installed; before that, the level the CPU's flags allow. Standard library only.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def capability_from_flags() -> str:
    """The SIMD level torch would pick on this CPU, from /proc/cpuinfo's flags (x86-64 only)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return "unknown"
    flags = next((set(line.partition(":")[2].split()) for line in text.splitlines() if line.startswith("flags")),
                 set())
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return "AVX512"
    return "AVX2" if {"avx2", "fma"} <= flags else "DEFAULT"


def capability() -> str:
    try:
        import torch
    except ImportError:
        return f"{capability_from_flags()} (from the CPU's flags; torch is not installed yet)"
    return f"{torch.backends.cpu.get_cpu_capability()} (torch {torch.__version__})"


def machine_line() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"machine: {cpu_model()}, {platform.machine()}, {cores} cores, CPU capability {capability()}, "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}")


if __name__ == "__main__":
    print(machine_line())
    sys.exit(0)
