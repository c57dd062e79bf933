"""The options of one capture, gathered in one frozen object and checked once against the model's adapter.

``tracediff.capture(model, out, **options)`` keeps its keyword arguments; inside, they become a
:class:`CaptureOptions`. :meth:`CaptureOptions.checked` refuses, in one place and in this order, a
``tensors`` mode that does not exist, an option the model's runtime does not support (the adapter's
``supported_options``, naming the runtime), a ``compiled`` mode that does not exist, a negative ``writers``
or ``pool_mb``, and malformed ``steps`` or ``other_steps``. What needs the model itself (``ops_in`` patterns,
``compiled="regions"`` on a model with no compiled region, a teacher-forcing reference of another
vocabulary) is checked where the model is at hand, before anything is written.

:meth:`CaptureOptions.metadata` is the trace metadata's ``options`` object, with the parts only the running
capture knows (the op selection, the payload pipeline, the teacher-forcing reference) handed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .. import format as fmt
from ..errors import UsageError
from .adapters import GATED_OPTIONS, Adapter, check_options
from .compiled import COMPILED_MODES
from .decode_steps import check_other_steps, parse_steps
from .encode import TensorMode
from .pipeline import DEFAULT_POOL_MB, check_pipeline_options

TENSOR_MODES = ("full", "summary", "repr")


@dataclass(frozen=True)
class CaptureOptions:
    """Every option of ``tracediff.capture``, with its defaults; see ``capture``'s docstring for each one."""

    tensors: TensorMode = "full"
    prune_layers: bool = False
    overwrite: bool = False
    verify: bool = False
    ranks: Literal["all"] | int = 0
    full_dtensor: bool = False
    backward: bool = False
    progress: bool = False
    ops: bool | Sequence[str] = False
    ops_exclude: str | Sequence[str] = ()
    ops_in: str | Sequence[str] = ()
    ops_min_numel: int = 0
    writers: int | None = None
    pool_mb: int = DEFAULT_POOL_MB
    steps: str | Sequence[int] | None = None
    teacher_forcing: str | Path | None = None
    other_steps: str = "stats"
    compiled: str = "modules"

    def checked(self, adapter: Adapter) -> CaptureOptions:
        """These options, once valid for ``adapter``'s runtime; UsageError naming the first that is not."""
        if self.tensors not in TENSOR_MODES:
            raise UsageError(f"tensors={self.tensors!r}: expected one of {', '.join(TENSOR_MODES)}")
        check_options(adapter, self.gated())
        if self.compiled not in COMPILED_MODES:
            raise UsageError(f"compiled={self.compiled!r}: expected one of {', '.join(COMPILED_MODES)}")
        check_pipeline_options(self.writers, self.pool_mb)
        self.check_steps()
        return self

    def check_steps(self) -> None:
        """UsageError for malformed ``steps`` or ``other_steps`` (``capture_spec`` asks before building the
        model)."""
        parse_steps(self.steps)
        check_other_steps(self.other_steps)

    def gated(self) -> dict[str, Any]:
        """The options not every runtime supports (``GATED_OPTIONS``), as given."""
        return {name: getattr(self, name) for name in GATED_OPTIONS}

    @property
    def step_numbers(self) -> tuple[int, ...] | None:
        """``steps`` parsed (``"0,1,-1"`` -> ``(0, 1, -1)``); None: every step in full."""
        return parse_steps(self.steps)

    def records(self, rank: int) -> bool:
        """True when the process of ``rank`` writes a trace."""
        return self.ranks == "all" or self.ranks == rank

    def sharded(self, world: int) -> bool:
        """True when every rank of a multi-rank run writes its own folder (``ranks="all"``)."""
        return self.ranks == "all" and world > 1

    def metadata(self, *, ops: dict[str, Any] | None, payload_pipeline: dict[str, Any] | None,
                 teacher_forcing: dict[str, Any] | None) -> dict[str, Any]:
        """The metadata's ``options`` object, in the order the format has always written it; the capture adds
        ``steps`` (``fmt.STEPS_OPTION``) as it ends and updates ``payload_pipeline`` once the writers are done."""
        return {"tensors": self.tensors, "prune_layers": self.prune_layers, "verify": self.verify,
                "ranks": self.ranks, "full_dtensor": self.full_dtensor, "backward": self.backward, "ops": ops,
                "payload_pipeline": payload_pipeline, fmt.TEACHER_FORCING_OPTION: teacher_forcing,
                "compiled": self.compiled}
