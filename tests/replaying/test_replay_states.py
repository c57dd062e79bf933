"""A stateful argument (a KV cache) is given to every run of a call as B's forward first passed it.

transformers' decoder layers take ``past_key_values=`` (a ``DynamicCache``, made by the model when
``use_cache`` is on, its default) and append each call's keys and values to it. Replay calls B's modules with
what B's own forward passed them: the cache that forward left behind already holds every layer's keys, each
run appended more, and the float64 run's keys met a float32 run's query in the attention ("Expected query, key,
and value to have the same dtype"): no call of the attention could be judged, and the replay was undecided.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tracediff
from tests.replaying.test_replay_descend import IDS, fused_llama, llama_port

pytest.importorskip("transformers")


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_k_and_v_swapped_with_the_cache_on_names_that_layers_attention(capture_ref, attn):  # type: ignore[no-untyped-def]
    trace = capture_ref("fused-llama", fused_llama, IDS)
    result = tracediff.replay(llama_port(fused_llama(), attn, kv_swapped_in=1, use_cache=True), trace)
    assert result.verdict == "diverged" and not result.undecided, result.undecided
    assert [c.module_path_b for c in result.culprits] == ["LlamaForCausalLM.model.layers.1.self_attn"]
    attention = [c for c in result.modules if c.module_path_b.endswith("self_attn")]
    assert [c.verdict for c in attention] == ["same math", "B differs"]


def test_the_clean_port_with_the_cache_on_passes(capture_ref):  # type: ignore[no-untyped-def]
    trace = capture_ref("fused-llama", fused_llama, IDS)
    result = tracediff.replay(llama_port(fused_llama(), "sdpa", use_cache=True), trace)
    assert result.passed and result.verdict == "passed", result.undecided


class Store:
    """A cache of one's own (neither a tensor nor a container): each call appends to its own slot, as a KV
    cache's layers do."""

    def __init__(self) -> None:
        self.rows: dict[int, list[torch.Tensor]] = {}


class Projection(nn.Module):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class Cached(Projection):
    """The port's projection: through its slot of the store (the sum of what the slot holds: ``x`` itself when
    the slot was empty, as it is when the forward starts)."""

    def forward(self, x: torch.Tensor, store: Store) -> torch.Tensor:  # type: ignore[override]
        store.rows.setdefault(self.index, []).append(x)
        return self.proj(torch.stack(store.rows[self.index]).sum(0))


class Net(nn.Module):
    def __init__(self, cached: bool) -> None:
        super().__init__()
        self.cached = cached
        kind = Cached if cached else Projection
        self.first, self.second = kind(0), kind(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.cached:
            return self.second(self.first(x))
        store = Store()
        return self.second(self.first(x, store), store)


def net(cached: bool) -> nn.Module:
    torch.manual_seed(0)
    return Net(cached).eval()


def test_every_run_gets_the_store_as_the_forward_first_passed_it(capture_ref):  # type: ignore[no-untyped-def]
    """B's calls take a store A's do not: they run in B's layout, each on a fresh copy of the store as it was
    when the forward started (empty), run after run (the float64 run and reruns included)."""
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
    trace = capture_ref("projections", lambda: net(False), x)
    model = net(True)
    result = tracediff.replay(model, trace)
    assert result.passed and result.verdict == "passed", [(c.module_path_b, c.reason) for c in result.modules]
    assert {c.module_path_b: c.verdict for c in result.modules if c.module_path_b.endswith(("first", "second"))} \
        == {"Net.first": "same math", "Net.second": "same math"}
    with torch.no_grad():
        model.first.proj.weight.mul_(1.25)  # a mistake in ``first``: named there, ``second`` not blamed
    result = tracediff.replay(model, trace)
    assert [c.module_path_b for c in result.culprits] == ["Net.first.proj"]
    assert next(c for c in result.modules if c.module_path_b == "Net.second").verdict == "same math"
