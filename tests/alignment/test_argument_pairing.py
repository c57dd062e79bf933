"""Arguments pair by the callee's parameter names (metadata ``forward_parameters``), then by value.

A research block takes ``(x, table)`` by position; its port takes ``(x, mask, table)``: by slot alone,
A's ``args.1`` (the table) meets B's ``args.1`` (the mask). By name, the table meets the table and the mask
is B's own argument, listed as unpaired.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from tests.alignment.helpers import capture
from tracediff import align
from tracediff import format as fmt
from tracediff.alignment.result import Unmatched

X = torch.linspace(-1, 1, 32).reshape(4, 8)


class ResearchBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + table


class PortBlock(ResearchBlock):
    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,  # type: ignore[override]
                table: torch.Tensor | None = None) -> torch.Tensor:
        out = self.fc(x) if mask is None else self.fc(x) * mask
        return out if table is None else out + table


class Net(nn.Module):
    def __init__(self, block: type[ResearchBlock], call: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.block = block()
        self.register_buffer("table", torch.randn(4, 8))
        self.call = call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ones = torch.ones(4, 8)
        if self.call == "research":
            return self.block(x, self.table)
        if self.call == "port":  # the mask by position, before the table
            return self.block(x, ones, self.table)
        return self.block(x, mask=ones)  # "forgot-table": the port never passes the table


def unmatched(entries: tuple[Unmatched, ...]) -> list[tuple[str, str | None]]:
    return [(u.module_path, u.tensor) for u in entries if u.tensor is not None]


def traces(tmp_path: Path, *calls: str) -> list[Path]:
    out = []
    for call in calls:
        net = Net(ResearchBlock if call == "research" else PortBlock, call)
        with torch.no_grad():
            out.append(capture(net, X, tmp_path / call))
    return out


def test_a_positional_argument_pairs_with_the_parameter_of_its_name(tmp_path: Path) -> None:
    research, port = traces(tmp_path, "research", "port")
    result = align(research, port)
    assert result.passed, result.first_divergence
    paired = {(row.tensor_a, row.tensor) for row in result.rows if row.module_path_b == "Net.block"}
    assert ("inputs.args.1", "inputs.args.2") in paired  # the table with the table, not with the mask
    assert unmatched(result.unmatched_b) == [("Net.block", "inputs.args.1")]


def test_without_parameter_names_the_slots_pair_as_before(tmp_path: Path) -> None:
    research, port = traces(tmp_path, "research", "port")
    for folder in (research, port):  # a trace of another writer: no forward_parameters
        path = folder / fmt.METADATA_FILE
        metadata = json.loads(path.read_text())
        del metadata["forward_parameters"]
        path.write_text(json.dumps(metadata))
    assert not align(research, port).passed  # args.1 against args.1: the table against the mask


def test_an_argument_the_other_side_never_passed_is_listed_not_paired_on_its_shape(tmp_path: Path) -> None:
    research, forgot = traces(tmp_path, "research", "forgot-table")
    result = align(research, forgot)
    first = result.first_divergence
    assert first is not None and (first.module_path_b, first.tensor) == ("Net.block", "outputs")
    assert unmatched(result.unmatched_a) == [("Net.block", "inputs.args.1")]
    assert unmatched(result.unmatched_b) == [("Net.block", "inputs.kwargs.mask")]
