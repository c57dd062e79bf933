"""Graph nodes against module calls: a ggml-like graph of a transformers Llama aligns with zero options.

The graph is computed with torch from the transformers model, the way llama.cpp's graph of a GGUF conversion
computes it (q/k rows permuted per head as ``convert_hf_to_gguf.py`` writes them, rotary on adjacent pairs,
``[T, C]`` nodes named ``attn_norm``, ``Qcur``, ``l_out`` in scopes ``blk.N``), and recorded through the
graph-node sink a graph runtime's adapter feeds (tracediff/capturing/graph.py). Reading the trace groups each
scope into a block call (tracediff/trace/graph_scopes.py); the alignment pairs the blocks with the decoder
layers and their nodes with the modules by values, and undoes the q/k permutation as a layout. These tests
need neither llama.cpp nor a GGUF: tests/ports/test_llama_cpp.py runs the real thing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import tracediff
from tracediff.capturing.adapters import AdapterBase, register_adapter, unregister_adapter
from tracediff.cli.main import main as cli_main
from tracediff.trace.vocabulary import GraphVocabulary

VOCAB, SEQ = 300, 8
TOKENS = torch.randint(3, 100, (1, SEQ), generator=torch.Generator().manual_seed(3))


def permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's q/k row permutation: rotary halves -> adjacent pairs, per head."""
    return rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def reference_model() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      max_position_embeddings=64, rope_theta=500000.0, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    return model


class GgmlLikeGraph:
    """A transformers Llama evaluated as llama.cpp's graph of its GGUF conversion, node by node (see above)."""

    def __init__(self, hf: torch.nn.Module, bug: str | None = None) -> None:
        self.hf, self.bug = hf, bug
        self.sink: Any = None
        self._index = 0

    def node(self, name: str, scope: str | None, op: str, output: torch.Tensor, sources: list[Any]) -> tuple[int, Any]:
        key = self._index
        self._index += 1
        self.sink.record_node(key=key, name=name, op=op, scope=scope, output=output.detach().contiguous(),
                              sources=sources)
        return key, output

    def weight(self, linear: torch.nn.Linear, heads: int | None = None) -> torch.Tensor:
        return linear.weight if heads is None else torch.from_numpy(permute(linear.weight.numpy(), heads))

    def decode(self, ids: torch.Tensor) -> None:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        hf, config, node = self.hf, self.hf.config, self.node
        heads, kv_heads, dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        length = ids.shape[1]

        def pairs(t: torch.Tensor, n: int) -> torch.Tensor:  # rotary halves -> adjacent pairs, [T, n, D]
            return torch.from_numpy(permute(t.reshape(length, n * dim).T.numpy(), n).T.copy()).reshape(length, n, dim)

        def rms(x: torch.Tensor) -> torch.Tensor:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + config.rms_norm_eps)

        self.sink.begin_step()
        with torch.no_grad():
            table = hf.model.embed_tokens.weight
            if self.bug == "embedding-rows-shifted":  # a vocabulary off by one
                table = torch.roll(table, 1, dims=0)
            k_x, x = node("inp_embd", None, "GET_ROWS", table[ids[0]], ["token_embd.weight", "inp_tokens"])
            cos, sin = hf.model.rotary_emb(x[None], torch.arange(length)[None])
            for i, layer in enumerate(hf.model.layers):
                s, attn, mlp = f"blk.{i}", layer.self_attn, layer.mlp
                k_n, n = node("norm", s, "RMS_NORM", rms(x), [k_x])
                k_h, h = node("attn_norm", s, "MUL", n * layer.input_layernorm.weight, [k_n, f"{s}.attn_norm.weight"])
                k_q, q = node("Qcur", s, "MUL_MAT", h @ self.weight(attn.q_proj, heads).T, [f"{s}.attn_q.weight", k_h])
                k_k, k = node("Kcur", s, "MUL_MAT", h @ self.weight(attn.k_proj, kv_heads).T,
                              [f"{s}.attn_k.weight", k_h])
                v_weight = self.weight(attn.v_proj, kv_heads if self.bug == "v-permuted" else None)
                k_v, v = node("Vcur", s, "MUL_MAT", h @ v_weight.T, [f"{s}.attn_v.weight", k_h])
                k_q, _ = node("Qcur", s, "RESHAPE", q.reshape(length, heads, dim), [k_q])
                k_k, _ = node("Kcur", s, "RESHAPE", k.reshape(length, kv_heads, dim), [k_k])
                qh = attn.q_proj(h).view(length, heads, dim).transpose(0, 1)[None]
                kh = attn.k_proj(h).view(length, kv_heads, dim).transpose(0, 1)[None]
                qr, kr = apply_rotary_pos_emb(qh, kh, cos, sin)
                k_q, _ = node("Qcur", s, "ROPE", pairs(qr[0].transpose(0, 1), heads), [k_q, "inp_pos"])
                k_k, _ = node("Kcur", s, "ROPE", pairs(kr[0].transpose(0, 1), kv_heads), [k_k, "inp_pos"])
                k_ck, _ = node(f"cache_k_l{i}", None, "SET_ROWS", pairs(kr[0].transpose(0, 1), kv_heads),
                               [k_k, "cache_k"])
                k_cv, _ = node(f"cache_v_l{i}", None, "SET_ROWS", v.reshape(length, kv_heads, dim), [k_v, "cache_v"])
                group = heads // kv_heads
                values = v.view(length, kv_heads, dim).transpose(0, 1)[None].repeat_interleave(group, 1)
                att = torch.nn.functional.scaled_dot_product_attention(qr, kr.repeat_interleave(group, 1), values,
                                                                       is_causal=True)[0].transpose(0, 1)
                k_a, _ = node(f"node_{self._index}", None, "FLASH_ATTN_EXT", att, [k_q, k_ck, k_cv, "KQ_mask"])
                k_a, o = node("kqv_out", s, "RESHAPE", att.reshape(length, heads * dim), [k_a])
                k_o, o = node("attn_out", s, "MUL_MAT", attn.o_proj(o), [f"{s}.attn_output.weight", k_a])
                k_r, r = node("ffn_inp", s, "ADD", o + x, [k_o, k_x])
                k_n, n = node("norm", s, "RMS_NORM", rms(r), [k_r])
                k_h, h = node("ffn_norm", s, "MUL", n * layer.post_attention_layernorm.weight,
                              [k_n, f"{s}.ffn_norm.weight"])
                gate, up = mlp.gate_proj, mlp.up_proj
                if self.bug == "gate-up-swapped":
                    gate, up = up, gate
                k_g, g = node("ffn_gate", s, "MUL_MAT", gate(h), [f"{s}.ffn_gate.weight", k_h])
                k_u, u = node("ffn_up", s, "MUL_MAT", up(h), [f"{s}.ffn_up.weight", k_h])
                k_w, w = node("ffn_swiglu", s, "SWIGLU", torch.nn.functional.silu(g) * u, [k_g, k_u])
                k_f, f = node("ffn_out", s, "MUL_MAT", mlp.down_proj(w), [f"{s}.ffn_down.weight", k_w])
                k_x, x = node("l_out", s, "ADD", f + r, [k_f, k_r])
            k_n, n = node("norm", None, "RMS_NORM", rms(x), [k_x])
            k_h, h = node("result_norm", None, "MUL", n * hf.model.norm.weight, [k_n, "output_norm.weight"])
            node("result_output", None, "MUL_MAT", hf.lm_head(h), ["output.weight", k_h])
        self.sink.end_step()


class GgmlLikeAdapter(AdapterBase):
    """The graph's runtime: its adapter hands the capture's sink to the graph."""

    framework, models = "ggml-like", "ggml-like"
    graph = GraphVocabulary(scopes="blocks", views=frozenset({"RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "CONT"}),
                            same_values=frozenset({"RESHAPE", "CONT"}), rotary=frozenset({"ROPE"}))

    def recognises(self, model: Any) -> bool:
        return isinstance(model, GgmlLikeGraph)

    def version(self) -> str | None:
        return None

    def install(self, model: Any, recorder: Any, options: Any) -> Any:
        model.sink = recorder

        class Installed:
            def restore(self) -> None:
                model.sink = None

        return Installed()

    def host(self, value: Any) -> Any:
        return value

    def metadata(self, model: Any) -> dict[str, Any]:
        return {}


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("graph-blocks")
    adapter = GgmlLikeAdapter()
    register_adapter(adapter)
    hf = reference_model()
    with torch.no_grad(), tracediff.capture(hf, root / "hf"):
        hf(input_ids=TOKENS)

    def graph(bug: str | None) -> Path:
        out = root / (bug or "clean")
        if not out.exists():
            model = GgmlLikeGraph(hf, bug)
            with tracediff.capture(model, out):
                model.decode(TOKENS)
        return out

    yield root / "hf", graph
    unregister_adapter(adapter)


def _align(a: Path, b: Path, tmp_path: Path) -> tuple[int, dict[str, Any]]:
    report = tmp_path / "report.json"
    code = cli_main(["align", str(a), str(b), "--format", "json", "--output", str(report)])
    return code, json.loads(report.read_text())


def test_scopes_read_as_blocks(traces: Any) -> None:
    _, graph = traces
    trace = tracediff.load_trace(graph(None))
    root = trace.roots[0]
    assert [child.relative_path for child in root.children] == ["inp_embd", "blk.0", "blk.1", "norm", "result_norm",
                                                               "result_output"]
    block = root.children[1]
    assert block.module_type == "graph block" and block.children[0].relative_path == "blk.0.norm"
    assert [r.slot for r in block.tensors] == ["inputs.args.0", "outputs"]
    # its input is what inp_embd produced, its output what l_out produced (the same payloads)
    assert block.tensors[0].payload == root.children[0].outputs()[0].payload
    assert block.tensors[1].payload == block.children[-1].outputs()[0].payload
    # a cache view between the block's nodes belongs to the block
    assert "cache_k_l0" in [child.relative_path for child in block.children]


def test_clean_graph_passes_with_the_rotary_permutation_as_a_layout(traces: Any, tmp_path: Path) -> None:
    hf, graph = traces
    code, report = _align(hf, graph(None), tmp_path)
    assert code == 0, report["first_divergence"]
    rows = {(row["module_path_a"], row["module_path_b"], row["tensor"]): row for row in report["rows"]}
    q = rows["LlamaForCausalLM.model.layers.0.self_attn.q_proj", "GgmlLikeGraph.blk.0.Qcur", "outputs"]
    assert q["transform"] == "A.reshape(8,4,2,8).permute(0,1,3,2).reshape(8,64) ~ B"
    paired = {(a, b) for a, b, _ in rows}
    for a, b in (("model.embed_tokens", "inp_embd"), ("model.layers.0.input_layernorm", "blk.0.attn_norm"),
                 ("model.layers.1", "blk.1"),
                 ("model.layers.1.mlp.down_proj", "blk.1.ffn_out"), ("lm_head", "result_output")):
        assert (f"LlamaForCausalLM.{a}", f"GgmlLikeGraph.{b}") in paired


# the token lookup reads only the table and the prompt (outside the trace): it pairs with embed_tokens as the
# other call that reads only the token ids, so a wrong table is named there, not at layer 0's input
@pytest.mark.parametrize(("bug", "module"), [("v-permuted", "model.layers.0.self_attn.v_proj"),
                                             ("gate-up-swapped", "model.layers.0.mlp"),
                                             ("embedding-rows-shifted", "model.embed_tokens")])
def test_a_mistake_is_named_at_its_module(traces: Any, tmp_path: Path, bug: str, module: str) -> None:
    hf, graph = traces
    code, report = _align(hf, graph(bug), tmp_path)
    assert code == 1
    found = report["first_divergence"]["module_path_a"].split(".", 1)[1]
    assert found == module or found.startswith(module + "."), found


# --- a node's inputs are the tensors it read --------------------------------------------------------------------
# Gemma 3's attention normalises q per head in a module of its own (transformers' ``q_norm``: the norm and its
# weight) where llama.cpp's graph has two nodes, ``norm`` (RMS_NORM) and ``Qcur_normed`` (MUL); ``Qcur`` names
# the projection, its reshape and (there) its rotary. ``q_norm`` pairs with ``Qcur_normed`` on their outputs, but
# their inputs are two points of one computation: q, and q normalised.

HEADS, DIM = 2, 8


class HeadNorm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(DIM).uniform_(0.5, 1.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class NormedQuery(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = torch.nn.Linear(HEADS * DIM, HEADS * DIM, bias=False)
        self.q_norm = HeadNorm()
        self.o_proj = torch.nn.Linear(HEADS * DIM, HEADS * DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        q = self.q_norm(self.q_proj(x).view(1, length, HEADS, DIM).transpose(1, 2))
        return self.o_proj(q.transpose(1, 2).reshape(1, length, HEADS * DIM))


class NormedQueryLayer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = NormedQuery()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.self_attn(x)


class NormedQueryModel(torch.nn.Module):
    """Token rows whose heads have a root mean square of ``1 + spread * u`` (u uniform in [-1, 1]), and a
    ``q_proj`` that rotates each head (keeps its root mean square): the spread sets how far q and q normalised
    are apart."""

    def __init__(self, spread: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        rows = torch.randn(VOCAB, HEADS, DIM)
        rows = rows / rows.pow(2).mean(-1, keepdim=True).sqrt() * (1 + spread * torch.empty(VOCAB, HEADS, 1)
                                                                     .uniform_(-1, 1))
        self.embed_tokens = torch.nn.Embedding.from_pretrained(rows.reshape(VOCAB, HEADS * DIM))
        self.layers = torch.nn.ModuleList([NormedQueryLayer() for _ in range(2)])
        with torch.no_grad():
            for layer in self.layers:
                rotations = [torch.linalg.qr(torch.randn(DIM, DIM))[0] for _ in range(HEADS)]
                layer.self_attn.q_proj.weight.copy_(torch.block_diag(*rotations))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return x


class NormedQueryGraph(GgmlLikeGraph):
    """``NormedQueryModel`` as llama.cpp builds Gemma 3's q path: Qcur (MUL_MAT, RESHAPE), norm, Qcur_normed."""

    def decode(self, ids: torch.Tensor) -> None:
        hf, node, length = self.hf, self.node, ids.shape[1]
        self.sink.begin_step()
        with torch.no_grad():
            k_x, x = node("inp_embd", None, "GET_ROWS", hf.embed_tokens.weight[ids[0]], ["token_embd.weight",
                                                                                          "inp_tokens"])
            for i, layer in enumerate(hf.layers):
                s, attn = f"blk.{i}", layer.self_attn
                k_q, q = node("Qcur", s, "MUL_MAT", attn.q_proj(x), [f"{s}.attn_q.weight", k_x])
                k_q, q = node("Qcur", s, "RESHAPE", q.reshape(length, HEADS, DIM), [k_q])
                k_n, n = node("norm", s, "RMS_NORM", q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6), [k_q])
                k_m, m = node("Qcur_normed", s, "MUL", n * attn.q_norm.weight, [k_n, f"{s}.attn_q_norm.weight"])
                k_r, r = node("kqv_out", s, "RESHAPE", m.reshape(length, HEADS * DIM), [k_m])
                k_o, o = node("attn_out", s, "MUL_MAT", attn.o_proj(r), [f"{s}.attn_output.weight", k_r])
                k_x, x = node("l_out", s, "ADD", o + x, [k_o, k_x])
        self.sink.end_step()


# a spread of 0.3 sets q's statistics apart from q normalised (the pair is made on its outputs alone, and the
# inputs, of other shapes, were once paired again as a layout); 0.01 keeps them within the pairing's grades of
# agreement (relative distance 1e-1), while q and q normalised still differ by up to 1e-2, far beyond float32
# rounding (the input row compared them, and diverged)
@pytest.mark.parametrize("spread", [0.3, 0.01])
def test_an_input_is_compared_where_both_sides_read_it(tmp_path: Path, spread: float) -> None:
    adapter = GgmlLikeAdapter()
    register_adapter(adapter)
    try:
        hf = NormedQueryModel(spread).eval()
        with torch.no_grad(), tracediff.capture(hf, tmp_path / "a"):
            hf(input_ids=TOKENS)
        graph = NormedQueryGraph(hf)
        with tracediff.capture(graph, tmp_path / "b"):
            graph.decode(TOKENS)
    finally:
        unregister_adapter(adapter)
    code, report = _align(tmp_path / "a", tmp_path / "b", tmp_path)
    assert code == 0, report["first_divergence"]
    rows = {(row["module_path_a"].partition(".")[2], row["tensor_a"]): row for row in report["rows"]}
    for i in (0, 1):
        norm = f"layers.{i}.self_attn.q_norm"
        assert rows[norm, "outputs"]["module_path_b"] == f"NormedQueryGraph.blk.{i}.Qcur_normed"
        assert (norm, "inputs.args.0") not in rows  # compared as q_proj's output
        assert rows[f"layers.{i}.self_attn.q_proj", "outputs"]["status"] in ("identical", "close")
        # o_proj's input is Qcur_normed's output viewed (kqv_out computes nothing): compared as it was read
        assert rows[f"layers.{i}.self_attn.o_proj", "inputs.args.0"]["status"] in ("identical", "close")


# --- a node placed by its consumer ------------------------------------------------------------------------------
# llama.cpp's Gemma 3 graph leaves o_proj's MUL_MAT unnamed (``node_N``, outside any scope) and normalises its
# output in two nodes, ``norm`` and ``attn_post_norm``. When the attention before it is wrong (a layer pattern
# the GGUF cannot hold), that node agrees with no call; its consumer pairs with ``post_attention_layernorm``,
# which reads exactly o_proj's output, so the node is o_proj's, and the divergence is named in the attention.

WIDTH = 16


class MeanAttention(torch.nn.Module):
    """Each position's value is the mean of the values up to it (causal), or of all of them (``window``)."""

    def __init__(self) -> None:
        super().__init__()
        self.v_proj = torch.nn.Linear(WIDTH, WIDTH, bias=False)
        self.o_proj = torch.nn.Linear(WIDTH, WIDTH, bias=False)

    @staticmethod
    def mix(v: torch.Tensor, window: bool = False) -> torch.Tensor:
        if window:
            return v.mean(-2, keepdim=True).expand_as(v)
        return v.cumsum(-2) / torch.arange(1, v.shape[-2] + 1, dtype=v.dtype)[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o_proj(self.mix(self.v_proj(x)))


class PostNormedLayer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = MeanAttention()
        self.post_attention_layernorm = HeadNormWide()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.post_attention_layernorm(self.self_attn(x))


class HeadNormWide(HeadNorm):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(WIDTH).uniform_(0.5, 1.5))


class PostNormedModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed_tokens = torch.nn.Embedding(VOCAB, WIDTH)
        self.layers = torch.nn.ModuleList([PostNormedLayer() for _ in range(2)])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return x


class PostNormedGraph(GgmlLikeGraph):
    """``PostNormedModel`` as llama.cpp builds Gemma 3's attention output, with layer 0's attention mixing
    every position (another window than A's): from there on no node after ``Vcur`` agrees with a call."""

    def decode(self, ids: torch.Tensor) -> None:
        hf, node = self.hf, self.node
        self.sink.begin_step()
        with torch.no_grad():
            k_x, x = node("inp_embd", None, "GET_ROWS", hf.embed_tokens.weight[ids[0]], ["token_embd.weight",
                                                                                          "inp_tokens"])
            for i, layer in enumerate(hf.layers):
                s, attn, post = f"blk.{i}", layer.self_attn, layer.post_attention_layernorm
                k_v, v = node("Vcur", s, "MUL_MAT", attn.v_proj(x), [f"{s}.attn_v.weight", k_x])
                k_a, a = node("kqv_out", s, "CONT", attn.mix(v, window=i == 0), [k_v])
                k_o, o = node(f"node_{self._index}", None, "MUL_MAT", attn.o_proj(a), [f"{s}.attn_output.weight",
                                                                                      k_a])
                k_n, n = node("norm", s, "RMS_NORM", o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6), [k_o])
                k_p, p = node("attn_post_norm", s, "MUL", n * post.weight, [k_n, f"{s}.attn_post_norm.weight"])
                k_x, x = node("l_out", s, "ADD", p + x, [k_p, k_x])
        self.sink.end_step()


def test_a_node_agreeing_with_nothing_is_placed_by_its_consumer(tmp_path: Path) -> None:
    adapter = GgmlLikeAdapter()
    register_adapter(adapter)
    try:
        hf = PostNormedModel().eval()
        with torch.no_grad(), tracediff.capture(hf, tmp_path / "a"):
            hf(input_ids=TOKENS)
        graph = PostNormedGraph(hf)
        with tracediff.capture(graph, tmp_path / "b"):
            graph.decode(TOKENS)
    finally:
        unregister_adapter(adapter)
    code, report = _align(tmp_path / "a", tmp_path / "b", tmp_path)
    assert code == 1
    first = report["first_divergence"]
    # once, o_proj was left unpaired and post_attention_layernorm, paired with ``norm`` on sizes, was named
    assert first["module_path_a"] == "PostNormedModel.layers.0.self_attn.o_proj", first
    assert first["module_path_b"] == "PostNormedGraph.node_3", first
    rows = {(row["module_path_a"].partition(".")[2], row["module_path_b"].partition(".")[2], row["tensor_a"]): row
            for row in report["rows"]}
    for i, node in ((0, "node_3"), (1, "node_9")):
        # dataflow alone pairs them: reported as the weakest evidence, outputs only
        row = rows[f"layers.{i}.self_attn.o_proj", node, "outputs"]
        assert row["pairing"] == "shape" and row["status"] == "diverged", row
        assert (f"layers.{i}.self_attn.o_proj", node, "inputs.args.0") not in rows
