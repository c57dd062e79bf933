"""``docs/agents/SKILL.md``: the skill file convention (name, one-line description, procedure), and every
command line it shows parses with today's ``tracediff`` (an option renamed later fails here)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tracediff.cli.main import build_parser

SKILL = Path(__file__).resolve().parent.parent / "docs" / "agents" / "SKILL.md"
TEXT = SKILL.read_text(encoding="utf-8")


def _command_lines() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", TEXT, flags=re.DOTALL)
    lines = [line.split(";")[0].split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith("tracediff ")]


def test_the_front_matter_has_a_name_and_a_one_line_description() -> None:
    front = re.match(r"---\nname: ([a-z0-9-]+)\ndescription: (.+)\n---\n", TEXT)
    assert front is not None
    assert len(front.group(2)) < 300 and "\n" not in front.group(2)


def test_it_shows_the_commands_an_agent_needs() -> None:
    commands = {line.split()[1] for line in _command_lines()}
    assert {"capture", "align", "replay", "import", "show"} <= commands
    for needed in ("--baseline", "--ops", "--format json", "docs/schema/report.json", "first_divergence"):
        assert needed in TEXT, needed
    for code in "0123":
        assert f"| {code} |" in TEXT


@pytest.mark.parametrize("line", _command_lines())
def test_every_command_line_parses(line: str) -> None:
    build_parser().parse_args(shlex.split(line)[1:])
