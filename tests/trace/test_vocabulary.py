"""The metadata's graph vocabulary (docs/trace-format.md, section 9.2): what a reader takes from it, and what it
reads when a trace has none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tracediff
from tests.alignment.test_module_scopes import ExportedGraph, ExportedGraphAdapter, Net
from tracediff import format as fmt
from tracediff.capturing.adapters import register_adapter, unregister_adapter
from tracediff.trace.graph_scopes import GRAPH_BLOCK
from tracediff.trace.vocabulary import GraphVocabulary, trace_vocabulary


@pytest.fixture
def graph_trace(tmp_path: Path) -> Path:
    import torch

    adapter = ExportedGraphAdapter()
    register_adapter(adapter)
    try:
        torch.manual_seed(0)
        graph = ExportedGraph(Net().eval())
        with tracediff.capture(graph, tmp_path / "graph"):
            graph(torch.randn(1, 3, 8).numpy())
    finally:
        unregister_adapter(adapter)
    return tmp_path / "graph"


def _edit_metadata(folder: Path, **changes: object) -> None:
    path = folder / fmt.METADATA_FILE
    metadata = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            metadata.pop(key, None)
        else:
            metadata[key] = value
    path.write_text(json.dumps(metadata))


def test_the_capture_writes_its_adapters_vocabulary(graph_trace: Path) -> None:
    metadata = json.loads((graph_trace / fmt.METADATA_FILE).read_text())
    assert metadata["graph"] == {"scopes": "modules", "views": ["Reshape"], "same_values": ["Reshape"],
                                 "rotary": [], "approximations": {}}
    assert tracediff.load_trace(graph_trace).graph == ExportedGraphAdapter.graph


def test_unknown_approximation_names_are_ignored(graph_trace: Path) -> None:
    _edit_metadata(graph_trace, graph={"scopes": "modules", "views": ["Reshape"],
                                       "approximations": {"Gelu": "a_rounding_of_the_future",
                                                          "FLASH_ATTN_EXT": "ggml_flash_attention_f16"}})
    vocabulary = tracediff.load_trace(graph_trace).graph
    assert vocabulary is not None
    assert dict(vocabulary.approximations) == {"FLASH_ATTN_EXT": "ggml_flash_attention_f16"}


def test_a_llama_cpp_trace_without_graph_is_read_with_llama_cpps_vocabulary(graph_trace: Path) -> None:
    """A trace of format 1.6 from llama.cpp: blocks, its views, rotary ops and approximations."""
    _edit_metadata(graph_trace, graph=None, framework="llama.cpp", format_version="1.6")
    trace = tracediff.load_trace(graph_trace)
    from tracediff.capturing.adapters.llama_cpp import VOCABULARY

    assert trace.graph == VOCABULARY
    assert trace.graph.scopes == "blocks"
    # read as blocks: its numbered scopes (layers.0) group, the module chains below them do not
    blocks = [node.relative_path for node in trace.nodes() if node.module_type == GRAPH_BLOCK]
    assert blocks == ["layers.0", "layers.1"]


def test_a_module_runtime_has_no_vocabulary() -> None:
    assert trace_vocabulary({"framework": "torch"}) is None
    assert GraphVocabulary.from_json(["not", "an", "object"]) is None


def test_a_vocabulary_refuses_a_scope_style_or_approximation_it_does_not_know() -> None:
    with pytest.raises(ValueError, match="scopes='nested'"):
        GraphVocabulary(scopes="nested")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown tanh_gelu"):
        GraphVocabulary(approximations={"Gelu": "tanh_gelu"})
