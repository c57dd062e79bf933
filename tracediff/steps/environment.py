"""What a run ran on: versions, determinism flags, environment variables, installed packages.

``system_info()`` is always recorded (it is small and holds no secrets).
``environment_variables()`` and ``installed_packages()`` are recorded on
request. Environment variables whose name contains one of ``SECRET_MARKERS``
(case-insensitive: ``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``, ``GITHUB_AUTH``...)
have their value replaced by ``"<redacted>"``, and so has any
``user:password@`` inside a URL value (``HTTPS_PROXY``, ``PIP_INDEX_URL``).
Packages are read with ``importlib.metadata``; pip is never run.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import sys
from typing import Any

import torch

from .._version import __version__

SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "COOKIE", "PRIVATE")
REDACTED = "<redacted>"
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


def looks_secret(name: str) -> bool:
    """True when an environment variable's name suggests a secret (see ``SECRET_MARKERS``)."""
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def environment_variables(*, redact: bool = True) -> dict[str, str]:
    """``os.environ`` sorted by name; secrets redacted unless ``redact=False``."""
    out: dict[str, str] = {}
    for name in sorted(os.environ):
        value = os.environ[name]
        if redact:
            value = REDACTED if looks_secret(name) else _URL_USERINFO.sub(rf"\g<scheme>{REDACTED}@", value)
        out[name] = value
    return out


def installed_packages() -> dict[str, str]:
    """``{distribution name: version}`` of everything importable, sorted by lower-cased name."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] if dist.metadata else None
        if name and name not in found:  # the first one on sys.path is the one imported
            found[name] = dist.version
    return dict(sorted(found.items(), key=lambda item: item[0].lower()))


def system_info() -> dict[str, Any]:
    """Versions and the switches that change numerics (determinism, TF32, threads)."""
    info: dict[str, Any] = {
        "tracediff_version": __version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "executable": sys.executable,
        "cuda_version": torch.version.cuda,
        "cudnn_version": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "num_threads": torch.get_num_threads(),
        "default_dtype": str(torch.get_default_dtype()).removeprefix("torch."),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    try:
        import numpy

        info["numpy_version"] = numpy.__version__
    except ImportError:  # pragma: no cover - numpy is a dependency
        info["numpy_version"] = None
    return info
