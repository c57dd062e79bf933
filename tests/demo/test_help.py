"""Every subcommand's ``--help`` shows an example, including commands added later."""

from __future__ import annotations

import argparse

import pytest

from tracediff.cli.main import build_parser, main


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(actions) == 1
    return dict(actions[0].choices)


def test_every_registered_command_is_checked() -> None:
    assert {"demo", "show", "align", "plot", "capture"} <= set(_subparsers())


@pytest.mark.parametrize("name", sorted(_subparsers()))
def test_help_has_an_example_invocation(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([name, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "example" in text.lower(), f"`tracediff {name} --help` has no example"
    examples = [line.strip() for line in text.splitlines() if line.strip().startswith(f"tracediff {name}")]
    assert examples, f"`tracediff {name} --help` shows no `tracediff {name} ...` command line"
    assert _subparsers()[name].description, f"`tracediff {name}` has no description"
