"""What a graph runtime's ops and scopes mean, declared by its adapter and written into the trace it captures.

A module runtime's calls say what they are (a ``Linear``, a decoder layer); a graph runtime's nodes are ops
of its own vocabulary (ggml's ``RESHAPE``, ONNX's ``Transpose``, OpenVINO's ``Reshape``) under scopes of its
own syntax. Alignment needs five facts about them and nothing else; the adapter declares them as data
(``graph`` of :class:`tracediff.capturing.adapters.base.Adapter`), the capture writes them into the trace
metadata's ``graph`` (docs/trace-format.md, "Graph vocabulary"), and every reader takes them from there:
no code outside the adapter names a runtime's op.

* ``scopes``: how a node's scope names the calls it sits in. ``"blocks"``: one numbered block (llama.cpp's
  ``blk.0``), a node of no scope between two nodes of a block belonging to it; ``"modules"``: the chain of
  module paths the node was exported from (``model``, ``model.layers.0``, ``model.layers.0.self_attn``),
  each a call.
* ``views``: ops that move no value (reshape, view, permute, transpose, a copy): followed through when
  looking for what reads a tensor.
* ``same_values``: ops whose output holds its input's values in the same order (a reshape, a contiguous copy).
* ``rotary``: ops that apply a rotary position embedding.
* ``approximations``: op -> the name of a known rounding of that op's kernel (one of ``APPROXIMATIONS``),
  bounded from the node's inputs by :mod:`tracediff.compare.approximations`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .. import format as fmt

#: The approximations tracediff can bound, by the name a vocabulary gives them.
APPROXIMATIONS = ("ggml_flash_attention_f16", "ggml_gelu_f16_table", "ggml_geglu_f16_table", "xnnpack_gelu_erf")
#: Those tracediff can name but not bound from a trace: the approximation acts inside a delegated region
#: whose weights the trace does not hold (a graph node's ``attributes.approximations``, docs/trace-format.md).
UNBOUNDED = frozenset({"xnnpack_gelu_erf"})
SCOPE_STYLES = ("blocks", "modules")


@dataclass(frozen=True)
class GraphVocabulary:
    """A graph runtime's ops and scope syntax, as alignment reads them (see the module docstring)."""

    scopes: Literal["blocks", "modules"] = "modules"
    views: frozenset[str] = frozenset()
    same_values: frozenset[str] = frozenset()
    rotary: frozenset[str] = frozenset()
    approximations: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.scopes not in SCOPE_STYLES:
            raise ValueError(f"scopes={self.scopes!r}: expected one of {', '.join(SCOPE_STYLES)}")
        unknown = sorted(set(self.approximations.values()) - set(APPROXIMATIONS))
        if unknown:
            raise ValueError(f"approximations: unknown {', '.join(unknown)} (known: {', '.join(APPROXIMATIONS)})")

    def is_view(self, op: str | None) -> bool:
        return (op or "") in self.views

    def is_rotary(self, op: str | None) -> bool:
        return (op or "") in self.rotary

    def approximation(self, op: str | None) -> str | None:
        return self.approximations.get(op or "")

    def to_json(self) -> dict[str, Any]:
        return {fmt.GRAPH_SCOPES: self.scopes, fmt.GRAPH_VIEWS: sorted(self.views),
                fmt.GRAPH_SAME_VALUES: sorted(self.same_values), fmt.GRAPH_ROTARY: sorted(self.rotary),
                fmt.GRAPH_APPROXIMATIONS: dict(sorted(self.approximations.items()))}

    @classmethod
    def from_json(cls, data: Any) -> GraphVocabulary | None:
        """The vocabulary of a trace metadata's ``graph``; None when it is absent or not one (a reader then
        treats the trace's nodes as no runtime's: nothing is a view, a rotary op or an approximation)."""
        if not isinstance(data, Mapping):
            return None

        def names(key: str) -> frozenset[str]:
            value = data.get(key)
            return frozenset(v for v in value if isinstance(v, str)) if isinstance(value, list) else frozenset()

        scopes = data.get(fmt.GRAPH_SCOPES)
        approximations = data.get(fmt.GRAPH_APPROXIMATIONS)
        known = {str(k): v for k, v in approximations.items() if v in APPROXIMATIONS} \
            if isinstance(approximations, Mapping) else {}
        return cls(scopes=scopes if scopes in SCOPE_STYLES else "modules", views=names(fmt.GRAPH_VIEWS),
                   same_values=names(fmt.GRAPH_SAME_VALUES), rotary=names(fmt.GRAPH_ROTARY), approximations=known)


#: What a llama.cpp trace of format 1.6 or older meant without saying it (it has no ``graph``): the vocabulary
#: llama.cpp's adapter declared then. Read only for such traces (:func:`trace_vocabulary`).
_BEFORE_1_7 = GraphVocabulary(
    scopes="blocks", views=frozenset({"RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "CONT", "CPY"}),
    same_values=frozenset({"RESHAPE", "CONT"}), rotary=frozenset({"ROPE", "ROPE_BACK"}),
    approximations={"FLASH_ATTN_EXT": "ggml_flash_attention_f16", "GELU": "ggml_gelu_f16_table",
                    "GEGLU": "ggml_geglu_f16_table"})


def trace_vocabulary(metadata: Mapping[str, Any]) -> GraphVocabulary | None:
    """The graph vocabulary a trace's metadata declares (``graph``), or None for a trace of module calls."""
    declared = GraphVocabulary.from_json(metadata.get(fmt.GRAPH_KEY))
    if declared is not None:
        return declared
    if metadata.get("framework") == "llama.cpp":
        return _BEFORE_1_7
    return None


__all__ = ["APPROXIMATIONS", "GraphVocabulary", "SCOPE_STYLES", "UNBOUNDED", "trace_vocabulary"]
