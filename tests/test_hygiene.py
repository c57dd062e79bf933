"""The project's own checks: CI runs the README's command, which lints and type-checks; the license is shipped."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
ROOT = Path(__file__).resolve().parent.parent


def _readme_test_command() -> str:
    readme = ROOT.joinpath("README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, flags=re.S)
    commands = [block for block in blocks if "pytest" in block]
    assert len(commands) == 1, "the README should show one test command"
    return commands[0].strip()


def test_ci_runs_exactly_the_readme_command() -> None:
    script = ROOT.joinpath(".ci", "run").read_text(encoding="utf-8").strip().splitlines()
    assert script[-1].strip() == _readme_test_command()


def test_the_test_command_lints_and_type_checks_before_the_tests() -> None:
    command = _readme_test_command()
    ruff, mypy, pytest = (command.index(s) for s in ("ruff check tracediff tests bench scripts fixtures",
                                                      "mypy tracediff", "python -m pytest"))
    assert ruff < mypy < pytest
    extra = tomllib.loads(ROOT.joinpath("pyproject.toml").read_text(encoding="utf-8"))
    test_extra = " ".join(extra["project"]["optional-dependencies"]["test"])
    assert "ruff" in test_extra and "mypy" in test_extra


def test_lint_and_type_check_are_configured() -> None:
    config = tomllib.loads(ROOT.joinpath("pyproject.toml").read_text(encoding="utf-8"))
    assert config["tool"]["ruff"]["line-length"] == 120
    assert {"E", "F", "W", "I", "B", "UP"} <= set(config["tool"]["ruff"]["lint"]["select"])
    assert config["tool"]["mypy"]["ignore_missing_imports"] is True


def test_the_declared_license_is_shipped() -> None:
    config = tomllib.loads(ROOT.joinpath("pyproject.toml").read_text(encoding="utf-8"))
    assert config["project"]["license"] == {"text": "Apache-2.0"}
    text = ROOT.joinpath("LICENSE").read_text(encoding="utf-8")
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "END OF TERMS AND CONDITIONS" in text
