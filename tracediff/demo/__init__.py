"""``tracediff.demo.run_demo``: the porting story on an embedded example, in seconds.

::

    from tracediff.demo import run_demo

    demo = run_demo("tracediff-demo")
    print(demo.alignment.first_divergence.describe())
    assert demo.found_bug

A small decoder-only transformer (:mod:`tracediff.demo.models`) is written
twice: a reference, and a port with other module names, weights copied from
the reference, and one planted bug (the port's rotary embedding rotates
interleaved pairs instead of halves). Both run on the same tokens under
``tracediff.capture``; the traces are aligned with the rename map the demo
writes, and an HTML report is written next to them. Nothing is downloaded.

The folder then holds ``reference/`` and ``port/`` (the two traces),
``rename.json`` (the rename map, for ``tracediff align --map``) and
``report.html``.

``run_generation_demo`` tells the generation story the same way: a tiny
decoder generates 6 tokens with a KV cache (:mod:`tracediff.demo.decoding`),
and its port rotates the new token one position late in decode steps only.
Both generations are captured step by step; the alignment names the first
diverging decode step, the token position and the module.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..alignment import Alignment, align
from ..capturing import capture
from ..errors import OutputDirError
from ..files.atomic import write_json, write_text
from . import decoding
from .models import BUG_MODULE, RENAME_RULES, build_reference, example_tokens, port_from_reference

__all__ = ["run_demo", "run_generation_demo", "DemoResult", "BUG_MODULE", "RENAME_RULES"]


@dataclass(frozen=True)
class DemoResult:
    """What the demo wrote and found. ``bug_module`` is the full path of the planted bug in the port's trace."""

    out_dir: Path
    reference_trace: Path
    port_trace: Path
    rename_map: Path | None  # None: the generation demo, whose two sides share their module names
    report: Path
    alignment: Alignment
    bug_module: str
    plant_bug: bool
    bug_step: int | None = None  # the generation demo: the decode step and token position the bug shows at
    bug_position: int | None = None

    @property
    def found_bug(self) -> bool:
        """With the bug planted: the first divergence is the bug's module (and step and position, in the
        generation demo). Without it: the traces pass."""
        if not self.plant_bug:
            return self.alignment.passed
        first = self.alignment.first_divergence
        return (first is not None and first.module_path_b == self.bug_module
                and (self.bug_step is None or (first.step, first.position) == (self.bug_step, self.bug_position)))


def run_demo(out_dir: str | Path, *, overwrite: bool = False, plant_bug: bool = True) -> DemoResult:
    """Capture a reference model and its buggy port, align them, and write an HTML report into ``out_dir``.

    Args:
        out_dir: the demo folder; created if needed.
        overwrite: replace the files of an earlier demo in ``out_dir`` (default
            False: a folder that is not empty is refused). Other files are kept.
        plant_bug: port with the rotary-embedding bug (default True); False
            shows what a correct port looks like: every tensor within tolerance.

    Raises:
        OutputDirError: ``out_dir`` is a file, is not empty (without
            ``overwrite``), or cannot be written.
    """
    out = _demo_folder(out_dir, overwrite=overwrite)
    reference = build_reference()
    port = port_from_reference(reference, plant_bug=plant_bug)
    tokens = example_tokens()
    reference_dir, port_dir = out / "reference", out / "port"
    with torch.no_grad():
        with capture(reference, reference_dir, overwrite=overwrite):
            reference(tokens)
        with capture(port, port_dir, overwrite=overwrite):
            port(tokens)
    rename_map = out / "rename.json"
    write_json(rename_map, {"rename": [list(rule) for rule in RENAME_RULES]})
    alignment = align(reference_dir, port_dir, map=RENAME_RULES)
    from ..render.html import render_html

    report = out / "report.html"
    write_text(report, render_html(alignment))
    return DemoResult(out_dir=out, reference_trace=reference_dir, port_trace=port_dir, rename_map=rename_map,
                      report=report, alignment=alignment, bug_module=f"{type(port).__name__}.{BUG_MODULE}",
                      plant_bug=plant_bug)


def run_generation_demo(out_dir: str | Path, *, overwrite: bool = False, plant_bug: bool = True) -> DemoResult:
    """Capture a reference decoder's generation and its port's, align them step by step, write an HTML report.

    Args:
        out_dir: the demo folder; created if needed.
        overwrite: replace the files of an earlier demo in ``out_dir`` (default
            False: a folder that is not empty is refused).
        plant_bug: port with the decode-only rotary bug (default True); False:
            every decode step within tolerance.

    Raises:
        OutputDirError: as ``run_demo``.
    """
    out = _demo_folder(out_dir, overwrite=overwrite)
    reference, port = decoding.build_pair(plant_bug=plant_bug)
    prompt = decoding.prompt_tokens()
    reference_dir, port_dir = out / "reference", out / "port"
    for model, folder in ((reference, reference_dir), (port, port_dir)):
        with torch.no_grad(), capture(model, folder, overwrite=overwrite):
            model.generate(prompt, max_new_tokens=decoding.NEW_TOKENS)
    alignment = align(reference_dir, port_dir)
    from ..render.html import render_html

    report = out / "report.html"
    write_text(report, render_html(alignment))
    return DemoResult(out_dir=out, reference_trace=reference_dir, port_trace=port_dir, rename_map=None,
                      report=report, alignment=alignment, bug_module=f"{type(port).__name__}.{decoding.BUG_MODULE}",
                      plant_bug=plant_bug, bug_step=decoding.BUG_STEP, bug_position=decoding.BUG_POSITION)


def _demo_folder(out_dir: str | Path, *, overwrite: bool) -> Path:
    """The demo folder, checked and created."""
    out = Path(out_dir)
    _check_out_dir(out, overwrite=overwrite)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # under a regular file, or in a read-only folder
        raise OutputDirError(f"{out}: cannot write here ({e.strerror or e})") from None
    return out


def _check_out_dir(out: Path, *, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"{out}: is a file; choose another folder for the demo (--out DIR)")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise OutputDirError(f"{out}: already exists and is not empty; pass --overwrite to replace the demo "
                             "there, or choose another folder with --out DIR")
