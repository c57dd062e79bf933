"""tracediff never imports torchvision: a broken one (a CUDA build beside a CPU torch) cannot break a text model's work.

The test puts a ``torchvision`` on the path that fails on import the way the
registry's CUDA build does beside a CPU torch (``operator torchvision::nms
does not exist``), then runs ``import tracediff``, ``tracediff capture`` of a
small text model, ``show`` and ``align`` in one fresh interpreter. Each must
exit 0 and leave ``torchvision`` out of ``sys.modules``; had anything tried to
import it, the command would have failed (or the module would be listed).

The model is plain PyTorch: transformers itself imports torchvision whenever
one is installed (``transformers.image_utils``, reached even by
``from transformers import LlamaConfig``), which docs/troubleshooting.md
explains; what is tested here is that tracediff adds no such import.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

BROKEN_TORCHVISION = 'raise RuntimeError("operator torchvision::nms does not exist")\n'

SPEC = textwrap.dedent("""
    import torch
    from torch import nn

    class TextModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(32, 16)
            self.layers = nn.ModuleList(
                nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
                for _ in range(2))
            self.head = nn.Linear(16, 32)

        def forward(self, input_ids):
            hidden = self.embed(input_ids)
            for layer in self.layers:
                hidden = layer(hidden)
            return self.head(hidden)

    def text_model():
        torch.manual_seed(0)
        return TextModel().eval(), {"input_ids": torch.arange(6).unsqueeze(0)}
""")

PROBE = textwrap.dedent("""
    import contextlib, io, json, sys
    import tracediff
    report = [["import tracediff", 0, "torchvision" in sys.modules]]
    from tracediff.cli.main import main
    for argv in {argvs!r}:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            try:
                code = main(argv)
            except SystemExit as e:
                code = e.code
        report.append([" ".join(argv[:1]), code, "torchvision" in sys.modules, err.getvalue()[-300:]])
    print(json.dumps(report))
""")


def test_tracediff_never_imports_torchvision(tmp_path: Path) -> None:
    fake = tmp_path / "site" / "torchvision"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(BROKEN_TORCHVISION)
    spec = tmp_path / "spec.py"
    spec.write_text(SPEC)
    trace = tmp_path / "trace"
    argvs = [
        ["capture", f"{spec}:text_model", "--out", str(trace)],
        ["show", str(trace)],
        ["align", str(trace), str(trace)],
    ]
    env_path = f"{tmp_path / 'site'}"
    probe = f"import sys; sys.path.insert(0, {env_path!r})\n" + PROBE.format(argvs=argvs)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.splitlines()[-1])
    assert [row[:3] for row in report] == [
        ["import tracediff", 0, False],
        ["capture", 0, False],
        ["show", 0, False],
        ["align", 0, False],
    ], report


def test_the_broken_torchvision_stand_in_does_fail_on_import(tmp_path: Path) -> None:
    """The stand-in breaks whoever imports it, so the test above would see an import."""
    fake = tmp_path / "torchvision"
    fake.mkdir()
    (fake / "__init__.py").write_text(BROKEN_TORCHVISION)
    out = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert out.returncode == 1 and "operator torchvision::nms does not exist" in out.stderr
