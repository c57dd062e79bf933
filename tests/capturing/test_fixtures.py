"""The committed example traces: regenerated identically, small, documented, and showing what they claim."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from tests.capturing.helpers import files, nodes, payload, payload_fingerprint, tensor_entries, trace_json

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
PROVENANCE = "provenance.json"


def _script():
    spec = importlib.util.spec_from_file_location("make_fixtures", FIXTURES / "make_fixtures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _json_without_created(path: Path) -> object:
    data = json.loads(path.read_text())
    if path.name == "tracediff_metadata.json":
        data.pop("created")
    return data


# Why this holds on any x86-64 CPU: the fixtures are compared with what the format promises, not bit for bit.
# Float32 matrix products block and round differently from one CPU to another (AVX2, AVX-512, AMX; the BLAS
# library picks its kernel by CPU and thread count): measured, llama_tiny's k_proj outputs differ by 3e-8 between
# two CPUs, and every later tensor inherits that. So files, JSON keys, strings, dtypes and shapes must be
# identical, integers exact, and floating values (payload elements, statistics, printed numbers) within
# VALUE_ATOL + VALUE_RTOL * |committed| (a printed number also within one unit of its last printed digit). Rounding
# across CPUs stays below 1e-6 in these 2-layer, hidden-16 models; what a change to tracediff, transformers or
# the fixture script does is far larger (the port bug scales one weight by 5%).
VALUE_ATOL, VALUE_RTOL = 1e-5, 1e-4
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def _close(a: float, b: float, *, printed_unit: float = 0.0) -> bool:
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b):
        return a == b or (math.isnan(a) and math.isnan(b))
    return abs(a - b) <= VALUE_ATOL + VALUE_RTOL * abs(b) + printed_unit


def _last_digit_unit(text: str) -> float:
    """One unit in the last printed digit of ``text`` (``"3.0704e-04"``: 1e-8; ``"0.5"``: 0.1; ``"12"``: 1)."""
    mantissa, _, exponent = text.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


def _strings_close(a: str, b: str) -> bool:
    """The same text around its numbers, and each printed number within the bound (integers exact)."""
    if _NUMBER.split(a) != _NUMBER.split(b):
        return False
    for x, y in zip(_NUMBER.findall(a), _NUMBER.findall(b)):
        integral = not any(c in x + y for c in ".eE")
        if x != y and (integral or not _close(float(x), float(y),
                                              printed_unit=max(_last_digit_unit(x), _last_digit_unit(y)))):
            return False
    return True


def json_differences(fresh: Any, committed: Any, where: str = "") -> list[str]:
    """Where two JSON values differ beyond what rounding on another CPU explains (see ``VALUE_ATOL``)."""
    if isinstance(fresh, dict) and isinstance(committed, dict):
        if list(fresh) != list(committed):
            return [f"{where or '/'}: keys {list(committed)} -> {list(fresh)}"]
        return [d for key in fresh for d in json_differences(fresh[key], committed[key], f"{where}/{key}")]
    if isinstance(fresh, list) and isinstance(committed, list):
        if len(fresh) != len(committed):
            return [f"{where}: {len(committed)} items -> {len(fresh)}"]
        return [d for i, (x, y) in enumerate(zip(fresh, committed)) for d in json_differences(x, y, f"{where}/{i}")]
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (fresh, committed))
    if numbers and not (isinstance(fresh, int) and isinstance(committed, int)):
        same = _close(float(fresh), float(committed))
    elif isinstance(fresh, str) and isinstance(committed, str):
        same = _strings_close(fresh, committed)
    else:
        same = type(fresh) is type(committed) and fresh == committed
    return [] if same else [f"{where}: {committed!r} -> {fresh!r}"]


def payload_difference(fresh: Path, committed: Path) -> str | None:
    """How a regenerated payload file differs beyond rounding (keys, dtypes, shapes exact; see ``VALUE_ATOL``)."""
    (keys_f, raw_f), (keys_c, raw_c) = payload_fingerprint(fresh), payload_fingerprint(committed)
    if keys_f != keys_c:
        return f"keys {keys_c} -> {keys_f}"
    for (dtype_f, shape_f, bytes_f), (dtype_c, shape_c, bytes_c) in zip(raw_f, raw_c):
        if (dtype_f, shape_f) != (dtype_c, shape_c):
            return f"{dtype_c} {list(shape_c)} -> {dtype_f} {list(shape_f)}"
        if bytes_f == bytes_c:
            continue
        dtype = getattr(torch, dtype_f.removeprefix("torch."))
        if not dtype.is_floating_point:
            return f"other {dtype_f} values"
        f, c = (torch.frombuffer(bytearray(b), dtype=dtype).double() for b in (bytes_f, bytes_c))
        excess = (f - c).abs() - (VALUE_ATOL + VALUE_RTOL * c.abs())
        if bool((excess > 0).any()) or not torch.equal(f.isnan(), c.isnan()):
            worst = int(excess.nan_to_num(float("inf")).argmax())
            return f"element {worst}: {float(c[worst]):.9g} -> {float(f[worst]):.9g}, beyond the bound"
    return None


def regeneration_problems(fresh: Path, committed: Path) -> list[str]:
    """How the regenerated fixture ``fresh`` differs from ``committed`` in what the format promises.

    The same files; the same JSON (the capture time aside), numbers within the
    bound above; the same payload keys, dtypes and shapes, values within the
    bound, the first tensor beyond it named. ``provenance.json`` is left out: it
    names the versions, compared apart.
    """
    names_fresh, names_committed = files(fresh) - {PROVENANCE}, files(committed) - {PROVENANCE}
    problems = [f"{name}: not written any more" for name in sorted(names_committed - names_fresh)]
    problems += [f"{name}: new" for name in sorted(names_fresh - names_committed)]
    for name in sorted(names_fresh & names_committed):
        if name.endswith(".json"):
            differences = json_differences(_json_without_created(fresh / name),
                                           _json_without_created(committed / name))
            if differences:
                more = f" (and {len(differences) - 1} more)" if len(differences) > 1 else ""
                problems.append(f"{name}: other JSON at {differences[0]}{more}")
        elif (fresh / name).read_bytes() != (committed / name).read_bytes():
            difference = payload_difference(fresh / name, committed / name)
            if difference is not None:
                problems.append(f"{name}: {difference}")
    return problems


def version_changes(committed: Path, now: dict[str, str | None]) -> list[str]:
    """``"transformers 5.23.0 -> 5.24.0"`` for each version that differs from the fixture's ``provenance.json``."""
    recorded = json.loads((committed / PROVENANCE).read_text())["versions"]
    return [f"{name} {recorded.get(name)} -> {version}" for name, version in now.items()
            if recorded.get(name) != version]


def regeneration_verdict(name: str, fresh: Path, committed: Path, now: dict[str, str | None]) -> str | None:
    """None when ``fresh`` is what ``committed`` promises; else one message naming the versions that changed."""
    problems = regeneration_problems(fresh, committed)
    if not problems:
        return None
    shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
    changes = version_changes(committed, now)
    cause = (f"it was written with other versions ({', '.join(changes)}): if the change is expected, regenerate "
             "with `python fixtures/make_fixtures.py` and commit" if changes else
             "it was written with the same versions, so tracediff or the fixture script changed")
    return f"{name}: the regenerated fixture differs ({shown}); {cause}"


@pytest.mark.slow
def test_fixtures_are_regenerated_as_the_format_promises(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    script = _script()
    names = list(script.FIXTURES)
    script.make_fixtures(tmp_path, only=names)
    verdicts = [regeneration_verdict(name, tmp_path / name, FIXTURES / name, script.versions()) for name in names]
    assert not any(verdicts), "\n".join(filter(None, verdicts))


def test_a_changed_fixture_names_the_version_that_changed(tmp_path: Path) -> None:
    script = _script()
    committed, fresh = tmp_path / "committed", tmp_path / "fresh"
    shutil.copytree(FIXTURES / "llama_tiny" / "ref", committed)
    shutil.copytree(FIXTURES / "llama_tiny" / "ref", fresh)
    now = json.loads((committed / PROVENANCE).read_text())["versions"]
    assert regeneration_verdict("llama_tiny/ref", fresh, committed, now) is None

    head = fresh / "LlamaForCausalLM.lm_head_inputs_args_0.safetensors"
    tensor = payload(fresh, "./" + head.name)
    save_file({"data": tensor + 3e-7}, str(head))  # what another CPU's rounding does: within the bound
    assert regeneration_verdict("llama_tiny/ref", fresh, committed, now) is None
    changed = tensor.clone()
    changed[0, 2, 5] *= 1.05
    save_file({"data": changed}, str(head))
    expected = float(tensor[0, 2, 5])
    assert regeneration_verdict("llama_tiny/ref", fresh, committed, now) == (
        "llama_tiny/ref: the regenerated fixture differs (LlamaForCausalLM.lm_head_inputs_args_0.safetensors: "
        f"element 37: {expected:.9g} -> {float(changed[0, 2, 5]):.9g}, beyond the bound); it was written with the "
        "same versions, so tracediff or the fixture script changed")

    newer = {**now, "transformers": "99.0.0"}
    verdict = regeneration_verdict("llama_tiny/ref", fresh, committed, newer)
    assert verdict is not None and verdict.endswith(
        f"it was written with other versions (transformers {now['transformers']} -> 99.0.0): if the change is "
        "expected, regenerate with `python fixtures/make_fixtures.py` and commit")
    assert set(script.versions()) == set(now) == {"python", "cpu_capability", *script.PRODUCERS}


def test_json_numbers_are_compared_within_the_bound_and_everything_else_exactly() -> None:
    committed = {"shape": "torch.Size([1, 6, 16])", "mean": "tensor(3.0704e-04)", "stats": {"numel": 96, "std": 0.25},
                 "repr": "tensor([[0.1234, -0.5000]])"}
    rounded_elsewhere = {**committed, "mean": "tensor(3.0705e-04)", "stats": {"numel": 96, "std": 0.25000001},
                         "repr": "tensor([[0.1235, -0.5000]])"}
    assert json_differences(rounded_elsewhere, committed) == []
    assert json_differences({**committed, "shape": "torch.Size([1, 6, 17])"}, committed) == [
        "/shape: 'torch.Size([1, 6, 16])' -> 'torch.Size([1, 6, 17])'"]
    assert json_differences({**committed, "mean": "tensor(3.2704e-04)"}, committed) == [
        "/mean: 'tensor(3.0704e-04)' -> 'tensor(3.2704e-04)'"]
    assert json_differences({**committed, "stats": {"numel": 97, "std": 0.25}}, committed) == ["/stats/numel: 96 -> 97"]
    assert json_differences({**committed, "stats": {"std": 0.25, "numel": 96}}, committed) == [
        "/stats: keys ['numel', 'std'] -> ['std', 'numel']"]
    assert json_differences({**committed, "repr": "tensor([[0.1234, -0.5000], [1.0, 2.0]])"}, committed)


def test_every_fixture_exists_is_documented_and_small() -> None:
    names = list(_script().FIXTURES)
    readme = (FIXTURES / "README.md").read_text()
    for name in names:
        assert (FIXTURES / name).is_dir() and f"`{name}`" in readme, name
        assert trace_json(FIXTURES / name)["module_path"]
        provenance = json.loads((FIXTURES / name / PROVENANCE).read_text())
        assert provenance["fixture"] == name and provenance["versions"]["torch"], name
    total = sum(p.stat().st_size for p in FIXTURES.rglob("*") if p.is_file())
    assert total < 2_000_000


def test_port_bug_departs_from_ref_exactly_at_the_documented_module() -> None:
    script = _script()
    ref, bug = FIXTURES / "llama_tiny" / "ref", FIXTURES / "llama_tiny" / "port_bug"
    assert f"`{script.PORT_BUG_MODULE}`" in (FIXTURES / "README.md").read_text()
    ref_tree, bug_tree = trace_json(ref), trace_json(bug)
    assert [n["module_path"] for n in nodes(ref_tree)] == [n["module_path"] for n in nodes(bug_tree)]

    def same(a: dict, b: dict) -> bool:
        return torch.equal(payload(ref, a).view(-1).view(torch.uint8), payload(bug, b).view(-1).view(torch.uint8))

    # transformers' trees list calls in order; leaves carry outputs, every node carries inputs.
    first_departure = None
    for a, b in zip(nodes(ref_tree), nodes(bug_tree)):
        if not all(same(x, y) for x, y in zip(tensor_entries(a.get("inputs")), tensor_entries(b.get("inputs")))):
            first_departure = first_departure or (a["module_path"], "inputs")
        if not all(same(x, y) for x, y in zip(tensor_entries(a.get("outputs")), tensor_entries(b.get("outputs")))):
            first_departure = first_departure or (a["module_path"], "outputs")
    assert first_departure == (script.PORT_BUG_MODULE, "outputs")
    # transformers keeps outputs on leaves only: the logits are lm_head's.
    head = "LlamaForCausalLM.lm_head"
    ref_head, bug_head = (next(n for n in nodes(t) if n["module_path"] == head) for t in (ref_tree, bug_tree))
    assert not same(ref_head["outputs"], bug_head["outputs"])


def test_native_fixture_is_the_same_run_as_ref() -> None:
    ref, native = FIXTURES / "llama_tiny" / "ref", FIXTURES / "llama_tiny" / "native"
    ref_leaves = {n["module_path"]: n for n in nodes(trace_json(ref)) if "outputs" in n}
    native_nodes = {n["module_path"]: n for n in nodes(trace_json(native))}
    assert len(ref_leaves) > 20
    for path, node in ref_leaves.items():
        for a, b in zip(tensor_entries(node["outputs"]), tensor_entries(native_nodes[path]["outputs"])):
            assert torch.equal(payload(ref, a), payload(native, b)), path
    meta = json.loads((native / "tracediff_metadata.json").read_text())
    assert meta["complete"] is True and meta["model_name"] == "LlamaForCausalLM"


def names_changes(committed: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What a transformers release renamed, per model: modules and ``forward`` parameters gone and new."""
    changes = []
    for key in sorted(set(committed["models"]) | set(now["models"])):
        before, after = committed["models"].get(key), now["models"].get(key)
        if before is None or after is None:
            changes.append(f"{key}: {'new' if before is None else 'no longer built'}")
            continue
        for part in ("modules", "forward"):
            gone = [n for n in before[part] if n not in after[part]]
            new = [n for n in after[part] if n not in before[part]]
            if gone or new:
                changes.append(f"{before['class']} {part}: {', '.join(gone[:4]) or '-'} -> {', '.join(new[:4]) or '-'}")
    return changes


def test_transformers_names_the_tests_rely_on_are_unchanged() -> None:
    """A transformers release that renames modules or ``forward`` arguments of common models is named here."""
    pytest.importorskip("transformers")
    script = _script()
    committed = json.loads((FIXTURES / script.NAMES_FILE).read_text())
    now = script.transformers_names()
    changes = names_changes(committed, now)
    assert not changes, (f"transformers {committed['transformers']} -> {now['transformers']} renamed: "
                         + "; ".join(changes) + ". Check the rename maps and docs that use these names, then "
                         "regenerate with `python fixtures/make_fixtures.py`")


def test_a_rename_is_named_model_part_and_names() -> None:
    committed = json.loads((FIXTURES / _script().NAMES_FILE).read_text())
    renamed = json.loads(json.dumps(committed))
    llama = renamed["models"]["llama"]
    llama["forward"] = [("past_key_values" if name == "cache" else name) for name in llama["forward"]]
    llama["modules"] = [name.replace("self_attn", "attention") for name in llama["modules"]]
    assert names_changes(committed, committed) == []
    assert names_changes(committed, renamed) == [
        "LlamaForCausalLM modules: model.layers.0.self_attn, model.layers.0.self_attn.q_proj, "
        "model.layers.0.self_attn.k_proj, model.layers.0.self_attn.v_proj -> model.layers.0.attention, "
        "model.layers.0.attention.q_proj, model.layers.0.attention.k_proj, model.layers.0.attention.v_proj",
        "LlamaForCausalLM forward: cache -> past_key_values",
    ]
