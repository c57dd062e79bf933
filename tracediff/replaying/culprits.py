"""Which out-of-tolerance calls are culprits, and which parents their culprit children explain.

A call whose verdict blames B (``B differs``, or ``out of tolerance``
without the oracle) is a candidate. Candidates are decided innermost first:

* a candidate with no culprit below it is a culprit;
* a candidate with culprits below it is rerun with those culprits' outputs
  replaced by A's recorded outputs; if it then no longer blames B, it is
  *explained by* them and is not a culprit, otherwise the code between its
  submodule calls differs too and it is a culprit as well.

Each culprit thus stands on its own local error, even with two bugs, and
even when the first bug is benign.

A call that could not be judged (``not comparable``: B's module raised, an
output is missing; or not run alone, and not judged inside its parent's run
either, :mod:`.inside`) inside a candidate may hold the mistake: the candidate is
then not named (replay descends into its children rather than naming the
parent) but **undecided**, with the unjudged call and its reason, unless a
call between them was judged the same math.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..trace.model import Node
from .result import BLAMING, NOT_COMPARABLE, SAME_MATH, WITHIN_TOLERANCE

PASSING = (SAME_MATH, WITHIN_TOLERANCE)


@dataclass
class Decision:
    culprit: bool = False
    explained_by: tuple[str, ...] = ()
    note: str = ""
    #: why the candidate cannot be named: a call inside it could not be judged ("" when it can)
    undecided: str = ""
    #: the module path (in B) of that call, the first one when several could not be judged
    unjudged: str = ""


@dataclass
class Candidate:
    key: int
    node_a: Node
    module_path_b: str
    verdict: str
    reason: str = ""
    decision: Decision = field(default_factory=Decision)


def _below(node: Node, ancestor: Node) -> bool:
    parent = node.parent
    while parent is not None:
        if parent is ancestor:
            return True
        parent = parent.parent
    return False


def unjudged_below(candidate: Candidate, candidates: list[Candidate]) -> list[Candidate]:
    """The calls inside ``candidate`` that could not be judged, and that no call between them and
    ``candidate`` judged the same math (a passing parent vouches for what it ran)."""
    return open_calls([c for c in candidates if _below(c.node_a, candidate.node_a)])


def open_calls(candidates: list[Candidate]) -> list[Candidate]:
    """Calls that could not be judged and that no call around them judged the same math."""
    passing = [c for c in candidates if c.verdict in PASSING]
    return [c for c in candidates if c.verdict == NOT_COMPARABLE
            and not any(_below(c.node_a, p.node_a) for p in passing)]


def _undecided(unjudged: list[Candidate]) -> Decision:
    first = unjudged[0]
    more = f" (and {len(unjudged) - 1} more)" if len(unjudged) > 1 else ""
    return Decision(undecided=f"{first.module_path_b} inside it could not be judged{more} "
                              f"({first.reason or 'not comparable'}): the mistake may be there",
                    unjudged=first.module_path_b)


def decide(candidates: list[Candidate], rerun: Callable[[Candidate, list[Candidate]], str] | None) -> None:
    """Fill each candidate's ``decision``; ``rerun(parent, children)`` returns the parent's patched verdict.

    Without ``rerun`` (B's call tree unknown), a candidate with a culprit below it is taken as explained.
    """
    culprits: list[Candidate] = []
    for candidate in sorted(candidates, key=lambda c: -c.node_a.depth):
        if candidate.verdict not in BLAMING:
            continue
        below = [c for c in culprits if _below(c.node_a, candidate.node_a)]
        unjudged = unjudged_below(candidate, candidates)
        if not below:
            if unjudged:
                candidate.decision = _undecided(unjudged)
                continue
            candidate.decision = Decision(culprit=True)
            culprits.append(candidate)
            continue
        names = tuple(c.module_path_b for c in below)
        patched_verdict = rerun(candidate, below) if rerun is not None else None
        if patched_verdict is None or patched_verdict not in BLAMING:
            candidate.decision = Decision(explained_by=names)
        elif unjudged:
            candidate.decision = _undecided(unjudged)
        else:
            candidate.decision = Decision(
                culprit=True, note=f"still {patched_verdict} with the outputs of {len(below)} culprit "
                                   "submodule call(s) replaced by A's: the code between its submodule calls "
                                   "differs too")
            culprits.append(candidate)
