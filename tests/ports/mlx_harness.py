"""The MLX part of the real-port suite: transformers (A) against mlx-lm's own implementation (B).

A transformers model is built from a tiny config with seeded random weights and saved as a checkpoint;
mlx-lm loads that folder with its own model code (``mlx_lm.utils.load_model``, nothing downloaded), as a
user converting a model does. Both run the same token ids. A mistake is an edit of the loaded MLX model
(a setting, or a weight as converted), or of the checkpoint's ``config.json`` before mlx-lm reads it.

Every case is aligned with zero options (``tracediff align A B``); the bf16 case casts the MLX model to
bfloat16 and adds ``--baseline`` (transformers cast to bfloat16). A case is right as in the torch suite
(tests/ports/harness.py): clean and bf16 exit 0, a mistake exits 1 with its first divergence at the
expected module or inside it, while the clean port passes.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import tracediff
from tests.ports.harness import BF16, CLEAN, Outcome, inside, relative, spread_norms
from tracediff.cli.main import main as cli_main

INSTALL = 'pip install -c constraints.txt -e ".[mlx]"'
MODE = "no map"
VOCAB, SEQ = 64, 8
TOKENS = torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(3))
# transformers' tiny configs: 2 layers, hidden size 32, grouped-query attention (4 heads, 2 key/value heads)
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=False, use_cache=False)


@dataclass(frozen=True)
class MlxBug:
    """A conversion mistake: an edit of the loaded MLX model or of the checkpoint's config, and where it lands.

    ``module`` is B's module path relative to the root.
    """

    name: str
    what: str
    module: str
    edit_model: Callable[[Any], None] | None = None
    edit_config: Callable[[dict[str, Any]], None] | None = None
    # ``tracediff align`` options of this case (none: zero options, as users run it first)
    align_options: tuple[str, ...] = ()


@dataclass(frozen=True)
class MlxPort:
    """One transformers family and mlx-lm's implementation of it."""

    name: str
    config: str  # the transformers config class
    model: str  # the transformers model class
    settings: dict[str, Any]
    bugs: tuple[MlxBug, ...]
    # what a converter writes into config.json besides transformers' own keys (clean case)
    config_extra: dict[str, Any] = field(default_factory=dict)
    # mlx 0.32's CPU gather_mm (mlx-lm's stacked experts) runs float32 only: no bf16 case for an MoE on CPU
    bf16: bool = True

    def bug(self, name: str) -> MlxBug:
        return next(bug for bug in self.bugs if bug.name == name)

    def cases(self) -> tuple[str, ...]:
        return (CLEAN, *(bug.name for bug in self.bugs), *((BF16,) if self.bf16 else ()))


@dataclass
class MlxPortRun:
    """Every trace and verdict of one MLX port, captured lazily into ``root``."""

    port: MlxPort
    root: Path
    _traces: dict[str, Path] = field(default_factory=dict)
    _clean: Outcome | None = None

    def reference_model(self) -> torch.nn.Module:
        import transformers

        torch.manual_seed(0)
        config = getattr(transformers, self.port.config)(**{**COMMON, **self.port.settings})
        return spread_norms(getattr(transformers, self.port.model)(config).eval())

    def checkpoint(self, bug: MlxBug | None) -> Path:
        """The reference saved as a transformers checkpoint (config edited for a config mistake)."""
        folder = self.root / self.port.name / ("checkpoint" if bug is None or bug.edit_config is None
                                               else f"checkpoint-{bug.name}")
        if not folder.exists():
            self.reference_model().save_pretrained(folder)
            config_file = folder / "config.json"
            config = json.loads(config_file.read_text())
            config.update(self.port.config_extra)
            if bug is not None and bug.edit_config is not None:
                bug.edit_config(config)
            config_file.write_text(json.dumps(config))
        return folder

    def port_model(self, case: str) -> Any:
        import mlx.core as mx
        from mlx_lm.utils import load_model

        bug = None if case in (CLEAN, BF16) else self.port.bug(case)
        model, _ = load_model(self.checkpoint(bug))
        if bug is not None and bug.edit_model is not None:
            bug.edit_model(model)
        if case == BF16:
            model.set_dtype(mx.bfloat16)
        return model

    def trace(self, case: str) -> Path:
        """``reference``, ``reference-bf16``, ``clean``, ``bf16`` or a mistake's name."""
        if case not in self._traces:
            out = self.root / self.port.name / case
            if out.exists():
                shutil.rmtree(out)
            if case.startswith("reference"):
                model = self.reference_model()
                if case == "reference-bf16":
                    model = model.to(torch.bfloat16)
                with torch.no_grad(), tracediff.capture(model, out):
                    model(input_ids=TOKENS)
            else:
                import mlx.core as mx

                model = self.port_model(case)
                with tracediff.capture(model, out):
                    mx.eval(model(mx.array(TOKENS.numpy())))
            self._traces[case] = out
        return self._traces[case]

    def align(self, case: str) -> tuple[int, str | None, str]:
        """``tracediff align A B`` in-process: exit code, first divergence's module (B's, relative), a note."""
        import contextlib
        import io

        argv = ["align", str(self.trace("reference")), str(self.trace(case))]
        if case == BF16:
            argv += ["--baseline", str(self.trace("reference-bf16"))]
        elif case != CLEAN:
            argv += list(self.port.bug(case).align_options)
        report = self.root / self.port.name / "report.json"
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = cli_main([*argv, "--format", "json", "--output", str(report)])
        if code not in (0, 1):
            return code, None, out.getvalue().strip().splitlines()[-1] if out.getvalue().strip() else ""
        first = json.loads(report.read_text())["first_divergence"]
        return code, relative(first["module_path_b"]) if first else None, ""

    def judge(self, case: str) -> Outcome:
        if case == CLEAN and self._clean is not None:
            return self._clean
        code, module, note = self.align(case)
        if case in (CLEAN, BF16):
            outcome = Outcome(self.port.name, case, MODE, code, module, 0, None, code == 0, note)
            if case == CLEAN:
                self._clean = outcome
            return outcome
        expected = self.port.bug(case).module
        right = code == 1 and inside(module, expected)
        if right and self.judge(CLEAN).exit_code != 0:
            right, note = False, "the clean port diverges too"
        return Outcome(self.port.name, case, MODE, code, module, 1, expected, right, note)


# --- the mistakes people make in MLX ports -----------------------------------------------------------------


def rope_traditional(layer: int) -> MlxBug:
    """mlx's ``RoPE(traditional=True)`` (interleaved pairs) where transformers rotates halves."""
    def edit(model: Any) -> None:
        model.model.layers[layer].self_attn.rope.traditional = True

    return MlxBug("rope-traditional", f"layer {layer}'s rotary with traditional=True (interleaved pairs)",
                  f"model.layers.{layer}.self_attn", edit_model=edit)


def norm_eps(eps: float) -> MlxBug:
    def edit(model: Any) -> None:
        for layer in model.model.layers:
            layer.input_layernorm.eps = eps
            layer.post_attention_layernorm.eps = eps

    return MlxBug("norm-eps", f"every decoder norm's eps {eps:g} instead of the config's",
                  "model.layers.0.input_layernorm", edit_model=edit)


def layer_norm_eps(layer: int, eps: float, *options: str) -> MlxBug:
    """One layer's input norm with another eps, aligned with ``options`` (tolerances a user tightened)."""
    def edit(model: Any) -> None:
        model.model.layers[layer].input_layernorm.eps = eps

    return MlxBug(f"layer-{layer}-norm-eps", f"layer {layer}'s input norm eps {eps:g} instead of the config's",
                  f"model.layers.{layer}.input_layernorm", edit_model=edit, align_options=options)


def attention_scale(layer: int) -> MlxBug:
    def edit(model: Any) -> None:
        attention = model.model.layers[layer].self_attn
        attention.scale = attention.scale ** 2  # 1/head_dim instead of 1/sqrt(head_dim)

    return MlxBug("attention-scale", f"layer {layer}'s attention scale 1/head_dim instead of 1/sqrt(head_dim)",
                  f"model.layers.{layer}.self_attn", edit_model=edit)


def o_proj_transposed(layer: int) -> MlxBug:
    def edit(model: Any) -> None:
        o_proj = model.model.layers[layer].self_attn.o_proj
        o_proj.weight = o_proj.weight.T

    return MlxBug("o-proj-transposed", f"layer {layer}'s square o_proj weight transposed",
                  f"model.layers.{layer}.self_attn.o_proj", edit_model=edit)


def kv_swapped(layer: int) -> MlxBug:
    def edit(model: Any) -> None:
        attention = model.model.layers[layer].self_attn
        attention.k_proj.weight, attention.v_proj.weight = attention.v_proj.weight, attention.k_proj.weight

    return MlxBug("kv-swapped", f"layer {layer}'s k_proj and v_proj weights swapped (GQA: same shape)",
                  f"model.layers.{layer}.self_attn", edit_model=edit)


def heads_regrouped(layer: int, heads: int = 4, head_dim: int = 8) -> MlxBug:
    """The query heads reordered (0, 2, 1, 3), o_proj's columns with them: what ``repeat_interleave`` against
    ``repeat`` of the key/value heads does to grouped-query attention. Without grouping it would be exact."""
    order = [0, 2, 1, 3]

    def edit(model: Any) -> None:
        import mlx.core as mx

        attention = model.model.layers[layer].self_attn
        rows = mx.array([h * head_dim + d for h in order for d in range(head_dim)])
        attention.q_proj.weight = attention.q_proj.weight[rows]
        if "bias" in attention.q_proj:
            attention.q_proj.bias = attention.q_proj.bias[rows]
        attention.o_proj.weight = attention.o_proj.weight[:, rows]

    return MlxBug("heads-regrouped", f"layer {layer}'s query heads grouped 0,2 / 1,3 with the key/value heads",
                  f"model.layers.{layer}.self_attn", edit_model=edit)


def embeddings_tied() -> MlxBug:
    """``lm_head`` tied to the token embedding although the checkpoint has its own (``tie_word_embeddings``)."""
    def edit(model: Any) -> None:
        model.lm_head.weight = model.model.embed_tokens.weight

    return MlxBug("embeddings-tied", "lm_head tied to the token embedding (the checkpoint's own left out)",
                  "lm_head", edit_model=edit)


def experts_swapped(layer: int, block: str) -> MlxBug:
    """Experts 0 and 1 of the stacked ``gate_proj`` swapped, as a converter stacking experts out of order."""
    def edit(model: Any) -> None:
        import mlx.core as mx

        switch = getattr(model.model.layers[layer], block).switch_mlp.gate_proj
        order = mx.array([1, 0, *range(2, switch.weight.shape[0])])
        switch.weight = switch.weight[order]

    return MlxBug("experts-swapped", f"layer {layer}'s stacked gate_proj with experts 0 and 1 swapped",
                  f"model.layers.{layer}.{block}", edit_model=edit)


def gemma_norm_plus_one(layer: int) -> MlxBug:
    """Gemma's norm weights converted with the ``1 +`` already added, which mlx-lm's Gemma RMSNorm adds again."""
    def edit(model: Any) -> None:
        norm = model.model.layers[layer].input_layernorm
        norm.weight = norm.weight + 1.0

    return MlxBug("norm-plus-one", f"layer {layer}'s input norm weight converted as 1 + w (mlx-lm adds the 1)",
                  f"model.layers.{layer}.input_layernorm", edit_model=edit)


def gemma_embedding_scale() -> MlxBug:
    """The embedding normalizer sqrt(hidden size) computed from another size (16 instead of 32)."""
    def edit(model: Any) -> None:
        model.model.args.hidden_size = 16

    return MlxBug("embedding-scale", "the embedding scaled by sqrt(16) instead of sqrt(hidden size 32)", "model",
                  edit_model=edit)


def rope_theta_lost() -> MlxBug:
    """The checkpoint as transformers 5 writes it: ``rope_theta`` only under ``rope_parameters``, where this
    mlx-lm model does not look; it takes its own default (1e6) instead of the config's 1e4."""
    return MlxBug("rope-theta-lost", "rope_theta left nested in rope_parameters: mlx-lm's default 1e6 is used",
                  "model.layers.0.self_attn", edit_config=lambda config: config.pop("rope_theta", None))


PORTS = (
    MlxPort("mlx-llama", "LlamaConfig", "LlamaForCausalLM", {},
            (rope_traditional(0), norm_eps(1e-2), kv_swapped(0), heads_regrouped(1), embeddings_tied())),
    MlxPort("mlx-qwen3", "Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 8},
            (attention_scale(1), o_proj_transposed(1), norm_eps(1e-2))),
    MlxPort("mlx-phi3", "Phi3Config", "Phi3ForCausalLM", {"original_max_position_embeddings": 32, "pad_token_id": 0},
            (rope_traditional(1), attention_scale(0), o_proj_transposed(1))),
    # mlx-lm's Gemma 2 ties lm_head to the embedding, and scales the embedding after embed_tokens, where
    # transformers scales inside it (accepted: docs/frameworks.md)
    MlxPort("mlx-gemma2", "Gemma2Config", "Gemma2ForCausalLM",
            {"head_dim": 8, "sliding_window": 16, "tie_word_embeddings": True},
            (gemma_norm_plus_one(0), gemma_embedding_scale(), kv_swapped(1))),
    MlxPort("mlx-mixtral", "MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2},
            (experts_swapped(0, "block_sparse_moe"), kv_swapped(1)), bf16=False),
    MlxPort("mlx-qwen2-moe", "Qwen2MoeConfig", "Qwen2MoeForCausalLM",
            {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
             "shared_expert_intermediate_size": 32, "decoder_sparse_step": 1, "rope_theta": 10000.0},
            (rope_theta_lost(), experts_swapped(1, "mlp")), config_extra={"rope_theta": 10000.0}, bf16=False),
)
