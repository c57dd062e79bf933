"""One run of a tiny random Llama for the sharded-trace tests: the one-process reference, or a TP=2 run.

    python tests/distributed/tp_run.py save CKPT [llama|qwen2]    # the checkpoint, fixed seed
    python tests/distributed/tp_run.py ref CKPT OUT               # one process
    torchrun --nproc-per-node 2 tests/distributed/tp_run.py hf CKPT OUTROOT [[ENGINE:][FAMILY:]MISTAKE,...]
    torchrun --nproc-per-node 2 tests/distributed/tp_run.py torch CKPT OUTROOT [[ENGINE:][FAMILY:]MISTAKE,...]

``hf`` loads with transformers' ``tp_plan="auto"``; ``torch`` parallelizes the one-process model with torch's
``parallelize_module`` (the torchtitan way). Each MISTAKE (default ``none``) plants a tensor-parallel bug (see
``MISTAKES``) in a freshly loaded model, captured into ``OUTROOT/{hf|torch}_{MISTAKE}``; ``FAMILY:MISTAKE``
loads ``CKPT/FAMILY`` instead and writes ``OUTROOT/{hf|torch}_{FAMILY}_{MISTAKE}``; an ``hf:`` or ``torch:``
prefix runs that engine instead of the command's (several engines in one launch).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

MISTAKES = ("none", "no_allreduce", "replica_differs", "shard_differs", "swapped_shards")


FAMILIES = ("llama", "qwen2")


def save(ckpt: Path, family: str = "llama") -> None:
    """A tiny random checkpoint (seed 0): Llama, or Qwen2 (biases on q, k and v: sharded with their weights)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    sizes = {"vocab_size": 96, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
    if family == "qwen2":
        Qwen2ForCausalLM(Qwen2Config(**sizes)).save_pretrained(ckpt)
    else:
        LlamaForCausalLM(LlamaConfig(**sizes)).save_pretrained(ckpt)


def _auto_model() -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM


def _inputs() -> dict[str, torch.Tensor]:
    return {"input_ids": torch.arange(1, 13).reshape(1, 12) % 96}


def reference(ckpt: Path, out: Path) -> None:
    from transformers import LlamaForCausalLM

    import tracediff

    model = LlamaForCausalLM.from_pretrained(ckpt).eval()
    with torch.no_grad(), tracediff.capture(model, out):
        model(**_inputs())


def _plant(model: torch.nn.Module, mistake: str, rank: int) -> None:
    layer = model.model.layers[0]
    if mistake == "no_allreduce":  # a row-parallel layer whose partial sums are never reduced
        from transformers.distributed.tensor_parallel import RowwiseParallel

        class NoReduceRowwise(RowwiseParallel):
            def transform_output_post_forward(self, module, output, mesh):  # type: ignore[no-untyped-def]
                return output.to_local() if hasattr(output, "to_local") else output

        proj = layer.mlp.down_proj
        mesh = proj.weight.device_mesh
        proj.__dict__.pop("forward", None)
        NoReduceRowwise().install_forward(proj, mesh)
    elif mistake == "replica_differs" and rank == 1:  # a replicated weight not alike on every rank
        with torch.no_grad():
            layer.post_attention_layernorm.weight.mul_(1.5)
    elif mistake == "shard_differs" and rank == 1:  # rank 1 sharded another initialisation of the weight
        with torch.no_grad():
            local = layer.self_attn.k_proj.weight.to_local()
            local.copy_(torch.randn_like(local))
    elif mistake == "swapped_shards":  # gate shards loaded in the wrong rank order
        with torch.no_grad():
            local = layer.mlp.gate_proj.weight.to_local()
            other = local.clone()
            torch.distributed.all_reduce(other)  # rank0 + rank1 on both
            local.copy_(other - local)


def hf(ckpt: Path, out: Path, mistake: str) -> None:
    from transformers import LlamaForCausalLM

    import tracediff

    model = LlamaForCausalLM.from_pretrained(ckpt, tp_plan="auto").eval()
    _plant(model, mistake, torch.distributed.get_rank())
    with torch.no_grad(), tracediff.capture(model, out, ranks="all"):
        model(**_inputs())


def torch_tp(ckpt: Path, out: Path, mistake: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    import tracediff

    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),), mesh_dim_names=("tp",))
    model = _auto_model().from_pretrained(ckpt).eval()
    for i, layer in enumerate(model.model.layers):
        # the mistake: a row-parallel layer left with its partial sums, never all-reduced
        reduced = Partial() if mistake == "no_allreduce" and i == 0 else Replicate()
        parallelize_module(layer, mesh, {
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=reduced),
        })
    if mistake != "no_allreduce":
        _plant(model, mistake, torch.distributed.get_rank())
    with torch.no_grad(), tracediff.capture(model, out, ranks="all"):
        model(**_inputs())


def main(argv: list[str]) -> None:
    command, ckpt = argv[0], Path(argv[1])
    if command == "save":
        save(ckpt, argv[2] if len(argv) > 2 else "llama")
        return
    out = Path(argv[2])
    if command == "ref":
        reference(ckpt, out)
        return
    # [ENGINE:][FAMILY:]MISTAKE (ENGINE: the command's by default), with CKPT/FAMILY the other checkpoints
    for item in argv[3].split(",") if len(argv) > 3 else ["none"]:
        parts = item.split(":")
        engine = parts.pop(0) if parts[0] in ("hf", "torch") else command
        mistake, family = parts[-1], parts[0] if len(parts) == 2 else ""
        if mistake not in MISTAKES or (family and family not in FAMILIES) or len(parts) > 2 \
                or engine not in ("hf", "torch"):
            raise SystemExit(f"unknown run {item!r}: expected [ENGINE:][FAMILY:]MISTAKE, ENGINE hf or torch, "
                             f"FAMILY in {FAMILIES}, MISTAKE in {MISTAKES}")
        source = ckpt / family if family else ckpt
        name = f"{engine}_{family}_{mistake}" if family else f"{engine}_{mistake}"
        (hf if engine == "hf" else torch_tp)(source, out / name, mistake)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
