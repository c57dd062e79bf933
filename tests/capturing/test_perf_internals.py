"""The fast paths of capture give the same results as the slow, obvious ones.

* ``json_text`` builds exactly the text of ``json.dumps(obj, indent=...)``;
* ``write_tensor_file`` writes exactly the bytes of ``safetensors.torch.save_file``,
  also when the OS writes less than asked;
* ``tensor_stats`` in chunks, with reused buffers, agrees with one pass in float64.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from safetensors.torch import save_file

from tracediff import format as fmt
from tracediff.capturing import stats as stats_module
from tracediff.capturing._tree import without_values
from tracediff.capturing.stats import StatsBuffers, tensor_stats
from tracediff.errors import OutputDirError
from tracediff.files import atomic
from tracediff.files import json_text as json_text_module
from tracediff.files.atomic import write_json, write_json_pair
from tracediff.files.json_text import json_text, json_text_pair
from tracediff.files.payloads import write_tensor_file

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text())
keys = st.one_of(st.text(), st.integers(), st.floats(), st.booleans(), st.none())
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                            st.dictionaries(keys, inner, max_size=4)),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(value=json_values, indent=st.integers(0, 4))
def test_json_text_is_the_text_of_json_dumps(value: object, indent: int) -> None:
    assert json_text(value, indent=indent) == json.dumps(value, indent=indent)


def test_json_text_formats_repeated_small_containers_by_their_types_and_depth() -> None:
    """Small flat containers are formatted once per depth: ``True``, ``1`` and ``1.0``, or ``-0.0`` and
    ``0.0``, which compare equal, still get their own text."""
    small = [{"a": True}, {"a": 1}, {"a": 1.0}, [-0.0], [0.0], [True], [1], {"numel": 1}, [None, "x"]]
    tree = {"steps": [small, {"deeper": [small, small]}, small], "again": small}
    assert json_text(tree, indent=2) == json.dumps(tree, indent=2)
    text, _ = json_text_pair(tree, drop_key="value")
    assert text == json.dumps(tree, indent=2)


trace_like = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(["value", "stats", "shape", "x"]), inner, max_size=4)),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(tree=trace_like)
def test_json_text_dropping_a_key_is_the_text_of_the_tree_without_it(tree: object) -> None:
    assert json_text(tree, indent=2, drop_key="value") == json.dumps(without_values(tree), indent=2)
    assert json_text(tree, indent=None, drop_key="value") == json.dumps(without_values(tree))


@settings(max_examples=200, deadline=None)
@given(tree=trace_like)
def test_the_pair_of_texts_is_the_text_and_the_text_without_the_key(tree: object) -> None:
    text, stripped = json_text_pair(tree, drop_key="value")
    assert text == json.dumps(tree, indent=2)
    assert stripped == json.dumps(without_values(tree), indent=2)


tensor_entries = st.fixed_dictionaries(
    {"shape": st.just("torch.Size([2])"), "dtype": st.just("torch.float32")},
    optional={"value": st.one_of(st.text(max_size=3), st.lists(st.integers(), max_size=2)),
              "stats": st.dictionaries(st.sampled_from(["mean", "value"]), scalars, max_size=2),
              "py_type": st.just("int")})
trace_with_entries = st.recursive(
    st.one_of(scalars, tensor_entries),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(["value", "inputs", "args", "x"]), inner, max_size=3)),
    max_leaves=20,
)


def _without_entry_values(value: object) -> object:
    """The tree with ``value`` removed from tensor entries only, at any depth (a trace's SUMMARY file)."""
    if isinstance(value, dict):
        drop = fmt.is_tensor_entry(value)
        return {k: _without_entry_values(v) for k, v in value.items() if not (drop and k == "value")}
    if isinstance(value, list):
        return [_without_entry_values(v) for v in value]
    return value


@settings(max_examples=300, deadline=None)
@given(tree=trace_with_entries, indent=st.integers(0, 3))
def test_the_pair_drops_the_key_only_where_told_and_is_the_text_of_json_dumps(tree: object, indent: int) -> None:
    text, stripped = json_text_pair(tree, drop_key="value", indent=indent, drop_where=fmt.is_tensor_entry)
    assert text == json.dumps(tree, indent=indent)
    assert stripped == json.dumps(_without_entry_values(tree), indent=indent)


def test_the_pair_is_built_in_one_walk_even_when_values_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = {"shape": "torch.Size([2])", "dtype": "torch.float32", "value": "./a.safetensors", "stats": {"mean": 1.0}}
    tree = {"inputs": {"args": [entry, {"value": [entry]}]}, "outputs": entry}

    def second_walk(*args: object, **kwargs: object) -> str:
        raise AssertionError("the stripped text was built by a second walk")

    monkeypatch.setattr(json_text_module, "json_text", second_walk)
    text, stripped = json_text_pair(tree, drop_key="value", drop_where=fmt.is_tensor_entry)
    assert text == json.dumps(tree, indent=2)
    assert stripped == json.dumps(_without_entry_values(tree), indent=2)
    assert stripped.count("./a.safetensors") == 0 and '"value": [' in stripped


shared_trees = st.recursive(
    st.one_of(scalars, st.integers(0, 2).map(lambda i: ("entry", i))),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(["inputs", "args", "outputs", "x"]), inner, max_size=3)),
    max_leaves=20,
)


def _with_shared(value: object, entries: list[dict[str, object]]) -> object:
    """``value`` with each ``("entry", i)`` leaf replaced by the very object ``entries[i]``."""
    if isinstance(value, tuple) and value[:1] == ("entry",):
        return entries[value[1]]
    if isinstance(value, dict):
        return {k: _with_shared(v, entries) for k, v in value.items()}
    if isinstance(value, list):
        return [_with_shared(v, entries) for v in value]
    return value


@settings(max_examples=300, deadline=None)
@given(shape=shared_trees, entries=st.lists(tensor_entries, min_size=3, max_size=3), indent=st.integers(0, 3))
def test_the_pair_of_a_tree_whose_entries_are_shared_is_the_text_of_json_dumps(
    shape: object, entries: list[dict[str, object]], indent: int
) -> None:
    """A tensor entry that is one object in several places, at several depths (a call's output read by the
    next ones), is formatted once and written again at each place's indentation."""
    tree = {"children": [_with_shared(shape, entries), {"deeper": [[_with_shared(shape, entries)]]}]}
    text, stripped = json_text_pair(tree, drop_key="value", indent=indent, drop_where=fmt.is_tensor_entry,
                                    repeated=fmt.is_tensor_entry)
    assert text == json.dumps(tree, indent=indent)
    assert stripped == json.dumps(_without_entry_values(tree), indent=indent)


def test_a_shared_entry_is_formatted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = {"shape": "torch.Size([2])", "dtype": "torch.float32", "value": "./a.safetensors",
             "stats": {"mean": 1.0, "min": -0.0}}
    tree = {"outputs": entry, "children": [{"inputs": {"args": [entry]}, "outputs": [entry, {"x": [entry]}]}]}
    walked: list[int] = []
    losing_key = json_text_module._IndentedJsonPair._dict_losing_key

    def counted(self: object, value: dict[str, object], depth: int, drop: str) -> None:
        walked.append(id(value))
        losing_key(self, value, depth, drop)  # type: ignore[arg-type]

    monkeypatch.setattr(json_text_module._IndentedJsonPair, "_dict_losing_key", counted)
    text, stripped = json_text_pair(tree, drop_key="value", drop_where=fmt.is_tensor_entry,
                                    repeated=fmt.is_tensor_entry)
    assert text == json.dumps(tree, indent=2)
    assert stripped == json.dumps(_without_entry_values(tree), indent=2)
    assert walked == [id(entry)]


def test_write_json_pair_writes_both_files_and_nothing_when_it_cannot_serialize(tmp_path: Path) -> None:
    tree = {"inputs": {"args": [{"shape": "torch.Size([2])", "value": "./a.safetensors"}]}, "module_path": "M"}
    write_json_pair(tmp_path / "full.json", tmp_path / "summary.json", tree, drop_key="value")
    assert json.loads((tmp_path / "full.json").read_text()) == tree
    assert (tmp_path / "summary.json").read_text() == json.dumps(without_values(tree), indent=2)
    with pytest.raises(TypeError):
        write_json_pair(tmp_path / "a.json", tmp_path / "b.json", {"x": object()}, drop_key="value")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full.json", "summary.json"]


def test_json_text_of_a_trace_like_tree_and_its_failures() -> None:
    class Flag(int):
        pass

    tree = {"module_path": "M", "call_index": Flag(2), "inputs": {"args": [{"shape": "torch.Size([2])", "stats": {
        "mean": math.nan, "max": math.inf, "min": -math.inf, "zeros": 0}}]}, "children": [], "x": {}, "é": "ü\n"}
    for indent in (None, 1, 2):
        assert json_text(tree, indent=indent) == json.dumps(tree, indent=indent)
    with pytest.raises(TypeError, match="not JSON serializable"):
        json_text({"a": [object()]})
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        json_text(loop)


def test_write_json_that_cannot_serialize_leaves_no_file(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        write_json(tmp_path / "out.json", {"bad": {1, 2}})
    assert list(tmp_path.iterdir()) == []
    write_json(tmp_path / "out.json", {"good": [1, 2.5, None]}, indent=1)
    assert (tmp_path / "out.json").read_text() == json.dumps({"good": [1, 2.5, None]}, indent=1)


TENSORS = [
    torch.arange(12, dtype=torch.float32).reshape(3, 4),
    torch.arange(12, dtype=torch.float32).reshape(3, 4).t(),  # not contiguous
    torch.tensor(3.5, dtype=torch.float64),  # 0-d
    torch.zeros(0, 5, dtype=torch.bfloat16),  # empty
    torch.tensor([[True, False, True]]),
    torch.arange(-3, 4, dtype=torch.int8),
    torch.randn(5, 7, generator=torch.Generator().manual_seed(0)).half(),
]


@pytest.mark.parametrize("tensor", TENSORS, ids=lambda t: f"{t.dtype}-{tuple(t.shape)}")
def test_payload_bytes_are_those_of_safetensors_save_file(tmp_path: Path, tensor: torch.Tensor) -> None:
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    assert write_tensor_file(ours, tensor) == tensor.numel() * tensor.element_size()
    save_file({"data": tensor.contiguous()}, str(theirs))
    assert ours.read_bytes() == theirs.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ours.safetensors", "theirs.safetensors"]


def test_payload_is_complete_when_the_os_writes_a_few_bytes_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write, calls = os.write, []

    def dribble(fd: int, data: bytes) -> int:
        calls.append(len(data))
        return real_write(fd, bytes(memoryview(data)[:7]))

    monkeypatch.setattr(atomic, "_HAS_WRITEV", False)
    monkeypatch.setattr(os, "write", dribble)
    tensor = torch.randn(10, 3, generator=torch.Generator().manual_seed(1))
    write_tensor_file(tmp_path / "t.safetensors", tensor)
    monkeypatch.undo()
    save_file({"data": tensor}, str(tmp_path / "ref.safetensors"))
    assert (tmp_path / "t.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()
    assert len(calls) > 10


def test_a_write_that_makes_no_progress_is_an_output_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(atomic, "_HAS_WRITEV", False)
    monkeypatch.setattr(os, "write", lambda fd, data: 0)
    with pytest.raises(OutputDirError, match="t.safetensors: could not write payload"):
        write_tensor_file(tmp_path / "t.safetensors", torch.ones(3))
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def reference_stats(t: torch.Tensor) -> dict[str, float]:
    a = t.double().reshape(-1).numpy()
    return {"numel": a.size, "min": a.min(), "max": a.max(), "zeros": int((a == 0).sum()), "mean": a.mean(),
            "std": a.std(ddof=1) if a.size > 1 else math.nan, "abs_mean": np.abs(a).mean()}


def assert_close_to_reference(got: dict[str, float], t: torch.Tensor) -> None:
    want = reference_stats(t)
    for key in ("numel", "min", "max", "zeros"):
        assert got[key] == want[key], key
    # Rounding of m-term float32 sums (float64 for float64 data), as in test_stats.
    m, eps = t.numel(), 2.0**-52 if t.dtype == torch.float64 else 2.0**-23
    rms = float(t.double().square().mean().sqrt())
    for key in ("mean", "abs_mean", "std"):
        bound = math.sqrt(2 * m * eps) * rms if key == "std" else 2 * m * eps * rms
        if math.isnan(want[key]):
            assert math.isnan(got[key])
        else:
            assert abs(got[key] - want[key]) <= bound + 1e-300, (key, got[key], want[key])


small_values = st.one_of(st.just(0.0), st.floats(-100, 100, width=32))


@settings(max_examples=80, deadline=None)
@given(values=arrays(np.float32, st.integers(1, 90), elements=small_values),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]))
def test_chunked_statistics_agree_with_one_pass(values: np.ndarray, dtype: torch.dtype) -> None:
    t = torch.from_numpy(values).to(dtype)
    whole = tensor_stats(t)
    original = stats_module.CHUNK
    stats_module.CHUNK = 8  # many chunks, the last one short
    try:
        chunked = tensor_stats(t, buffers=StatsBuffers())
    finally:
        stats_module.CHUNK = original
    assert_close_to_reference(chunked, t)
    assert {k: chunked[k] for k in ("numel", "min", "max", "zeros")} == {
        k: whole[k] for k in ("numel", "min", "max", "zeros")}


def test_buffers_reused_across_sizes_dtypes_and_layouts_give_fresh_results() -> None:
    generator = torch.Generator().manual_seed(3)
    tensors = [torch.randn(n, generator=generator).to(dtype) for n in (5, 300, 17, 1000, 2)
               for dtype in (torch.float32, torch.float64, torch.bfloat16)]
    tensors.append(torch.randn(6, 9, generator=generator)[:, ::2])  # not contiguous
    tensors.append(torch.tensor([0.0, -0.0, 2.0, 0.0]))  # zeros, including a negative one
    buffers = StatsBuffers()
    for t in tensors:
        shared = tensor_stats(t, buffers=buffers)
        assert shared == tensor_stats(t)
        assert_close_to_reference(shared, t)


def test_sums_that_overflow_float32_are_redone_in_float64() -> None:
    lowest = torch.finfo(torch.float32).min
    mask = torch.full((6, 6), lowest).triu(1)  # an additive attention mask: 15 x lowest, 21 zeros
    got = tensor_stats(mask)
    assert got["mean"] == pytest.approx(15 * lowest / 36, rel=1e-12)
    assert got["abs_mean"] == pytest.approx(-15 * lowest / 36, rel=1e-12)
    assert got["std"] == pytest.approx(float(mask.double().std()), rel=1e-9)
    assert (got["zeros"], got["min"], got["max"]) == (21, lowest, 0.0)


partials = st.tuples(st.floats(width=32), st.floats(width=32), st.floats(), st.floats(), st.floats(),
                     st.integers(0, 2**24), st.integers(0, 2**20), st.integers(0, 9), st.integers(0, 9))


@settings(max_examples=300, deadline=None)
@given(chunk=partials)
@example(chunk=(-0.0, -0.0, -0.0, 0.0, -0.0, 0, 2, 0, 0))  # sums of negative zeros: fsum gives 0.0
@example(chunk=(-1.0, 1.0, math.nan, 2.0, 2.0, 2, 2, 0, 0))
def test_one_chunk_summary_is_the_summary_of_the_fsum_of_one_term(chunk: tuple[float, ...]) -> None:
    got = stats_module.float_summary(100, [chunk])
    # A second chunk that adds nothing: the general path, through math.fsum and min/max over chunks.
    want = stats_module.float_summary(100, [chunk, (math.inf, -math.inf, 0.0, 0.0, 0.0, 0, 0, 0, 0)])
    assert repr(got) == repr(want)


def test_small_tensors_are_measured_in_views_handed_out_again() -> None:
    buffers = StatsBuffers()
    first = buffers.get(torch.device("cpu"), torch.float32, 512)
    assert buffers.get(torch.device("cpu"), torch.float32, 512) is first
    assert buffers.get(torch.device("cpu"), torch.float32, 513) is not first
    assert first.data_ptr() == buffers.get(torch.device("cpu"), torch.float32, 7).data_ptr()
    x = torch.randn(512, generator=torch.Generator().manual_seed(4))
    assert tensor_stats(x, buffers=buffers) == tensor_stats(x.clone(), buffers=buffers) == tensor_stats(x)


def test_buffers_stay_bounded_by_the_chunk_size() -> None:
    buffers = StatsBuffers()
    big = torch.ones(stats_module.CHUNK * 2 + 3)
    big[::3] = 0
    got = tensor_stats(big, buffers=buffers)
    assert got["zeros"] == (big.numel() + 2) // 3 and got["numel"] == big.numel()
    held = list(buffers._buffers.values())
    assert held and all(b.numel() <= stats_module.CHUNK for b in held)
