"""Pairing the calls of two traces top down: children only inside paired parents, values first.

The roots pair. Inside a pair of calls, the children of each side are lined up in call order and paired
by the strongest evidence each pair has (:mod:`tracediff.alignment.pairing.evidence`):

1. **map**: the user's rename rules turn A's path into B's;
2. **value**: the main outputs hold the same values (statistics agree, whatever the layout), with
   shapes that agree in size;
3. **name**: the same local name (``attn`` and ``attn``, ``decoder`` and ``model.decoder``);
4. **shape**: for two calls that call nothing themselves, inputs and outputs of the same sizes, in order.

Two calls that call nothing and pair on their outputs' values while their inputs hold other values
compute the same result from other inputs (one side does inside the call what the other does before
it): only their outputs are compared (``Matching.outputs_only``).

A call that computes nothing (its one output equals its one input: ``Identity``, ``Dropout`` in eval,
hook points) takes no part. A call left unpaired that has children is a wrapper one side has and the
other has not (``model`` in ``LlamaForCausalLM``, a ``Sequential`` MLP): its children take its place in
the line-up, and the line-up is done again.

**Repeated structures** (``layers.0``, ``layers.1``, ...) pair as a whole, instance ``N`` with instance
``N``; inside them, one line-up is decided for every instance at once, from the evidence of all of them,
so a bug in one layer cannot change how that layer pairs, and no call pairs across instances.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...maps.rules import RenameRules, apply_rename
from ...trace.graph_scopes import GRAPH_BLOCK
from ...trace.model import Node, TensorRecord
from .evidence import (
    Values,
    graded,
    is_transparent,
    main_output,
    name_similarity,
    numel,
    same_statistics,
    type_similarity,
)
from .unrecorded import NUMBERED

_MAX_ROUNDS = 8
# below this, a pair is not worth making (the weakest real pair, two same-size leaves, scores 1)
_MIN_SCORE = 0.5
_VETO = (-1.0, "veto")
_NAMED = 100.0  # the score of a pair the names or the map make
# the evidence of two calls that call nothing, paired on equal outputs although their inputs hold other
# values (transformers' BLOOM ``self_attention.dense`` and transformer-lens's ``attn``: the same projection,
# the attention before it inside the call on one side only): their inputs are not compared
OUTPUTS_ONLY = "value, outputs only"
# a call paired with a graph node by dataflow alone, whatever their values (the node that hands its result on,
# ``_pair_handed_on``, or the one its consumer places, ``_pair_by_consumer``): outputs only, reported as the
# weakest evidence
HANDED_ON = "dataflow, outputs only"
_GAP = 4  # the most calls on a side between two pairs for ``_fill_gaps`` to look at
# a node of a graph block takes the place of the call of A it agrees with best when the runner-up is this
# many times farther (``_closest``)
_CLEAR = 2.0


@dataclass(frozen=True)
class Repeated:
    """Numbered siblings (``layers.0``, ``layers.1``, ...): one item of a line-up."""

    prefix: str
    members: tuple[Node, ...]

    @property
    def numbers(self) -> tuple[int, ...]:
        return tuple(int(NUMBERED.match(m.relative_path).group(2)) for m in self.members)  # type: ignore[union-attr]


Item = Node | Repeated


@dataclass
class TreePairing:
    """Pairs calls of A and B top down (see the module docstring); ``pairs`` and ``evidence`` in pairing order."""

    values: Values
    rules: RenameRules = field(default_factory=list)
    use_names: bool = True
    pairs: list[tuple[Node, Node]] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    _transparent: dict[int, bool] = field(default_factory=dict)
    _children: dict[int, list[Node]] = field(default_factory=dict)
    _partner: dict[int, Node] = field(default_factory=dict)  # the scopes paired so far, both ways

    def run(self, roots_a: list[Node], roots_b: list[Node]) -> None:
        roots = list(zip(roots_a, roots_b))
        for a, b in roots:
            self._add(a, b, "name")
        if roots:
            self._pair_scope(roots)
        self.pair_idle()

    def pair_idle(self) -> None:
        """Calls left unpaired under paired parents pair with their namesakes when either computes nothing
        (``dropout`` with ``dropout``); a call that computes nothing pairs with nothing else."""
        if not self.use_names:
            return
        paired = {id(x) for pair in self.pairs for x in pair}
        for a, b in list(self.pairs):
            spare_b = {(c.relative_path, c.call_index): c for c in b.children if id(c) not in paired}
            for child in a.children:
                if id(child) in paired:
                    continue
                renamed = apply_rename(child.relative_path, self.rules) if self.rules else child.relative_path
                other = spare_b.get((renamed, child.call_index))
                if other is not None and not (self._computes(child, "a") and self._computes(other, "b")):
                    del spare_b[renamed, child.call_index]
                    paired |= {id(child), id(other)}
                    self._add(child, other, "map" if renamed != child.relative_path else "name")

    def idle(self) -> frozenset[int]:
        """``id`` of every call found to compute nothing."""
        return frozenset(key for key, transparent in self._transparent.items() if transparent)

    # --- the calls that compute -------------------------------------------------------------------------

    def _computes(self, node: Node, side: str) -> bool:
        key = id(node)
        if key not in self._transparent:
            self._transparent[key] = node.phase == "forward" and is_transparent(
                node, self.values, side, lambda child: self._computes(child, side))
        return not self._transparent[key]

    def children(self, node: Node, side: str) -> list[Node]:
        """The children of ``node`` that compute, in call order (forward calls only), less the calls that
        repeat an earlier call of their sibling module on the same values (transformer-lens's ``ln1``, called
        once for each of q, k and v): they compute nothing new, and count as calls that compute nothing."""
        key = id(node)
        if key not in self._children:
            kids = [c for c in node.children if c.phase == "forward" and self._computes(c, side)]
            first: dict[str, Node] = {}
            out = []
            for child in kids:
                earlier = first.setdefault(child.relative_path, child)
                if earlier is not child and self._called_again(child, earlier, side):
                    self._transparent[id(child)] = True
                else:
                    out.append(child)
            self._children[key] = out
        return self._children[key]

    def _called_again(self, node: Node, earlier: Node, side: str) -> bool:
        if len(node.tensors) != len(earlier.tensors) or not node.tensors:
            return False
        for x, y in zip(node.tensors, earlier.tensors):
            sx, sy = self.values.stats(x, side), self.values.stats(y, side)
            if x.slot != y.slot or x.shape != y.shape or not (sx and sy and same_statistics(sx, sy)):
                return False
        return True

    def _items(self, nodes: list[Node], parent: Node) -> list[Item]:
        """``nodes`` with numbered siblings of ``parent`` gathered into one ``Repeated`` item, at the first's place."""
        groups: dict[str, list[Node]] = {}
        for node in nodes:
            found = NUMBERED.match(node.relative_path)
            if found and node.call_index == 0 and node.parent is parent:
                groups.setdefault(found.group(1), []).append(node)
        repeated = {prefix for prefix, members in groups.items() if _repeats(members)}
        out: list[Item] = []
        placed: set[str] = set()
        for node in nodes:
            found = NUMBERED.match(node.relative_path)
            prefix = found.group(1) if found else None
            if prefix in repeated and node.call_index == 0 and node.parent is parent:
                if prefix not in placed:
                    placed.add(prefix)
                    out.append(Repeated(prefix, tuple(groups[prefix])))
                continue
            out.append(node)
        return out

    # --- a scope: one pair of calls, or every instance of a repeated structure ---------------------------

    def _pair_scope(self, scope: list[tuple[Node, Node]]) -> None:
        self._partner.update({id(a): b for a, b in scope})
        self._partner.update({id(b): a for a, b in scope})
        named = [self._namesakes(a, b) for a, b in scope]
        if all(pairs is not None for pairs in named):  # every child has its namesake: nothing to weigh
            for pairs in named:
                for x, y, how in pairs or ():
                    self._add(x, y, how)
                    self._pair_scope([(x, y)])
            return
        lines_a = [self._items(self.children(a, "a"), a) for a, _ in scope]
        lines_b = [self._items(self.children(b, "b"), b) for _, b in scope]
        lines_b = [self._in_value_order(line_b, line_a) if b.module_type == GRAPH_BLOCK else line_b
                   for line_a, line_b, (_, b) in zip(lines_a, lines_b, scope)]
        if len(scope) > 1 and not (_same_template(lines_a, scope, 0) and _same_template(lines_b, scope, 1)):
            for pair in scope:  # instances that differ in what they call pair one by one
                self._pair_scope([pair])
            return
        matched, total = self._line_up(lines_a, lines_b)
        for _ in range(_MAX_ROUNDS):
            paired_a = {j for j, _, _ in matched}
            paired_b = {k for _, k, _ in matched}
            open_a = [j for j, item in enumerate(lines_a[0]) if j not in paired_a and self._wraps(item, "a")]
            open_b = [k for k, item in enumerate(lines_b[0]) if k not in paired_b and self._wraps(item, "b")]
            # a wrapper is opened on one side, or both, whichever lines up best (one side first on a tie)
            options = []
            for take_a, take_b in ((open_a, []), ([], open_b), (open_a, open_b)):
                if not (take_a or take_b):
                    continue
                new_a = [self._dissolve(line, take_a, "a") for line in lines_a]
                new_b = [self._dissolve(line, take_b, "b") for line in lines_b]
                new_b = [self._in_value_order(line_b, line_a) if b.module_type == GRAPH_BLOCK else line_b
                         for line_a, line_b, (_, b) in zip(new_a, new_b, scope)]
                if len({len(line) for line in new_a}) > 1 or len({len(line) for line in new_b}) > 1:
                    continue  # the instances open into different calls: they no longer line up as one
                found, score = self._line_up(new_a, new_b)
                # opening wrappers gains nothing yet when the other side wraps its calls one level deeper too
                spare = (not take_a or len(paired_b) < len(lines_b[0])) and \
                    (not take_b or len(paired_a) < len(lines_a[0]))
                options.append((score, -len(take_a) - len(take_b), spare, new_a, new_b, found))
            if not options:
                break
            score, _, spare, new_a, new_b, found = max(options, key=lambda option: option[:2])
            if score < total or (score == total and not spare):
                break
            lines_a, lines_b, matched, total = new_a, new_b, found, score
        for j, k, how in matched:
            inner: list[tuple[Node, Node]] = []
            for line_a, line_b in zip(lines_a, lines_b):
                item_a, item_b = line_a[j], line_b[k]
                if isinstance(item_a, Repeated) and isinstance(item_b, Repeated):
                    inner += _instances(item_a, item_b)
                elif isinstance(item_a, Node) and isinstance(item_b, Node):
                    inner.append((item_a, item_b))
            for x, y in inner:
                self._add(x, y, how)
            if inner:
                self._pair_scope(inner)
        for filled in self._fill_gaps(lines_a, lines_b, matched):
            for x, y in filled:
                self._add(x, y, "shape")
            self._pair_scope(filled)
        for a, b in scope:
            if b.module_type == GRAPH_BLOCK:
                self._pair_handed_on(a, b)
                self._pair_by_consumer(a, b)

    def _in_value_order(self, line_b: list[Item], line_a: list[Item]) -> list[Item]:
        """A graph block's nodes in the order of the calls of A they hold the values of.

        A graph runtime's evaluation order among nodes that do not depend on each other is its scheduler's
        (llama.cpp evaluates ``Vcur`` before ``Kcur``), not the model's: each node whose main output agrees
        with one call of A clearly best (values, any layout: :func:`_closest`) moves to that call's place. A
        node that agrees with none and reads one node of the line continues that node's computation: it goes
        where the call of A sits that reads the output of its producer's counterpart (llama.cpp's Gemma 3
        ``norm`` and ``Kcur_normed`` after ``Kcur``, at ``k_norm``'s place after ``v_proj``, even when a wrong
        weight leaves their values agreeing with nothing), or where its producer was placed so. A node that
        agrees with none and whose result is continued, node by node, into one that agrees with a call goes
        just before that call (llama.cpp's Gemma 3 ``kqv``, ``node_N`` (o_proj), ``norm``, ``attn_post_norm``
        and ``sa_out`` before ``ffn_norm`` when a wrong attention leaves them agreeing with nothing, not among
        the q/k norms). Any other node moves with the node before it (``ffn_geglu``, which reads ``ffn_gate``
        and ``ffn_up``, stays after both; a rope, which no call of A reads the input of, stays where it runs)."""
        records_a = [(j, record) for j, other in enumerate(line_a)
                     if isinstance(other, Node) and (record := main_output(other)) is not None]
        producers = _line_producers(line_b)
        agreed: dict[int, int] = {}  # position in line_b -> position in line_a whose values it holds
        placed: set[int] = set()  # positions in line_b placed by their dataflow
        keys: list[float] = []
        key = -1.0
        for i, item in enumerate(line_b):
            record_b = main_output(item) if isinstance(item, Node) else None
            found = None if record_b is None else \
                _closest([(self.values.distance(record_a, record_b), j) for j, record_a in records_a])
            if found is not None:
                agreed[i] = found
                key = float(found)
            elif len(producers[i]) == 1:  # one producer: the node continues its computation (a weight's MUL)
                (p,) = producers[i]
                reader = self._reader(line_a, agreed[p]) if p in agreed else None
                if reader is not None or p in placed:
                    key = float(reader) if reader is not None else keys[p]
                    placed.add(i)
            keys.append(key)
        for i, j in _fed_forward(producers, agreed, placed).items():
            keys[i] = j - 0.5
        order = sorted(range(len(line_b)), key=lambda i: (keys[i], i))
        return [line_b[i] for i in order]

    def _pair_handed_on(self, a: Node, b: Node) -> None:
        """A call of ``a`` that calls others, none of them paired (B's graph computes it in nodes that answer
        none of its inner calls: a mixture of experts' stacked ``experts``, whose projections are no calls of
        A), pairs with the one node at its place in graph block ``b`` that hands a result on: the only
        unpaired node between the nodes paired with the calls of A just before and just after it whose output
        a node after that stretch reads, of as many elements as the call's output (ggml's ``ffn_moe_out``,
        the sum over the experts). That is dataflow, not values: a wrong expert leaves the values agreeing with
        nothing, and the pair still compares them. Only outputs are compared (the node reads partial sums)."""
        paired = self._partners()

        def lost(node: Node) -> bool:  # no call of its own subtree paired
            return not any(id(n) in paired for n in node.walk())

        for call in a.walk()[1:]:
            if call.phase != "forward" or not self.children(call, "a") or main_output(call) is None \
                    or not lost(call) or (call.parent is not a and call.parent is not None and lost(call.parent)):
                continue  # only the topmost call left without any pair is tried
            found = self._hand_on_node(call, a, b, paired)
            if found is not None:
                record_a, record_b = main_output(call), main_output(found)
                agree = record_a is not None and record_b is not None and \
                    graded(self.values.distance(record_a, record_b)) >= 0.75
                self._add(call, found, OUTPUTS_ONLY if agree else HANDED_ON)
                paired |= {id(call): found, id(found): call}

    def _pair_by_consumer(self, a: Node, b: Node) -> None:
        """A node of graph block ``b`` that agrees with no call of ``a`` and whose one consumer is paired with a
        call of A that reads exactly the output of a call X left unpaired pairs with X: the node computes what
        X computes, by dataflow (llama.cpp's Gemma 3 graph leaves ``o_proj``'s MUL_MAT unnamed, ``node_N``, and
        a wrong attention before it leaves its values agreeing with nothing; its consumer, ``norm``, pairs with
        ``post_attention_layernorm``, which reads ``o_proj``'s output). Only outputs are compared, as the weakest
        evidence (:data:`HANDED_ON`)."""
        paired = self._partners()
        calls = [n for n in a.walk()[1:] if n.phase == "forward" and main_output(n) is not None]
        made: dict[str, list[Node]] = {}  # payload -> the calls that returned it (a wrapper and its last call)
        for n in calls:
            for record in n.outputs():
                if record.payload:
                    made.setdefault(record.payload, []).append(n)

        def unpaired(payload: str) -> Node | None:  # its innermost maker, when no maker nor call inside is paired
            makers = made.get(payload, [])
            if not makers or any(id(n) in paired for n in makers) or any(id(n) in paired for n in makers[-1].walk()):
                return None
            return makers[-1]

        for node in b.children:
            record_b = main_output(node)
            if id(node) in paired or node.children or record_b is None or not record_b.payload:
                continue
            consumers = [n for n in b.children if any(r.payload == record_b.payload for r in n.inputs())]
            reader = paired.get(id(consumers[0])) if len(consumers) == 1 else None
            found = {id(x): x for r in reader.inputs() if r.payload and (x := unpaired(r.payload)) is not None} \
                if reader is not None else {}
            if len(found) != 1:
                continue
            (call,) = found.values()
            record_a = main_output(call)
            if record_a is None or numel(record_a) != numel(record_b) or any(
                    graded(self.values.distance(r, record_b)) >= 0.75 for n in calls if (r := main_output(n))):
                continue  # the node agrees with some call: its values, not its consumer, place it
            self._add(call, node, HANDED_ON)
            paired |= {id(call): node, id(node): call}

    def _partners(self) -> dict[int, Node]:
        """Each node paired so far, by identity, to its partner (both ways)."""
        return {id(x): y for pair in self.pairs for x, y in (pair, pair[::-1])}

    def _hand_on_node(self, call: Node, a: Node, b: Node, paired: dict[int, Node]) -> Node | None:
        before = [paired[id(n)] for n in a.walk()[1:] if id(n) in paired and n.exit_order < call.enter_order]
        after = [paired[id(n)] for n in a.walk()[1:] if id(n) in paired and n.enter_order > call.exit_order]
        low = max((n.exit_order for n in before), default=b.enter_order)
        high = min((n.enter_order for n in after), default=b.exit_order)
        low, high = min(low, high), max(low, high)  # B ran them in another order
        handed = {r.payload for r in b.outputs() if r.payload}  # the block's own output answers the block
        place = [n for n in b.children if id(n) not in paired and not n.children and low < n.enter_order < high
                 and not any(r.payload in handed for r in n.outputs())]
        ids = {id(n) for n in place}
        read_after = {r.payload for n in b.children if id(n) not in ids for r in n.inputs() if r.payload}
        exits = [n for n in place if any(r.payload in read_after for r in n.outputs() if r.payload)]
        if len(exits) != 1 or numel(main_output(exits[0])) != numel(main_output(call)):
            return None
        return exits[0]

    def _reader(self, line_a: list[Item], j: int) -> int | None:
        """The first call of A after ``line_a[j]`` that reads its main output (the same values), if any."""
        call = line_a[j]
        made = main_output(call) if isinstance(call, Node) else None
        stats = self.values.stats(made, "a") if made is not None else None
        if stats is None:
            return None
        for k in range(j + 1, len(line_a)):
            reader = line_a[k]
            if isinstance(reader, Node) and any(
                    numel(r) == numel(made) and (found := self.values.stats(r, "a")) is not None
                    and same_statistics(found, stats) for r in reader.inputs()):
                return k
        return None

    def _fill_gaps(self, lines_a: list[list[Item]], lines_b: list[list[Item]], matched: list[tuple[int, int, str]]
                   ) -> list[list[tuple[Node, Node]]]:
        """Between two paired neighbours, a call of each side pairs when they are the only two there that take
        the same inputs, with the sizes of one computation, and whose results come out of no other call,
        although their results differ: a bug there hides their values. A stretch that is all of an opened
        wrapper's calls offers that wrapper (transformer-lens's ``attn``, opened into its projections)."""
        out = []
        for (j0, k0, _), (j1, k1, _) in zip(matched, matched[1:]):
            if max(j1 - j0, k1 - k0) > _GAP + 1:  # a long stretch with nothing paired: no call is "the one left"
                continue
            options_a = self._stretch(lines_a, range(j0 + 1, j1), "a")
            options_b = self._stretch(lines_b, range(k0 + 1, k1), "b")
            found = [list(zip(xs, ys)) for xs in options_a for ys in options_b
                     if self._same_inputs(list(zip(xs, ys)))]
            if len(found) == 1:
                out.append(found[0])
        return out

    def _stretch(self, lines: list[list[Item]], positions: range, side: str) -> list[list[Node]]:
        """The calls of a stretch of every instance's line that could be the one left: each call (one per
        instance), and the wrapper whose computing calls the whole stretch is, when there is one."""
        calls = [[item for item in (line[i] for i in positions) if isinstance(item, Node)] for line in lines]
        if any(len(stretch) != len(positions) for stretch in calls):
            return []  # a repeated structure in the stretch: nothing here is one call
        options = [[stretch[i] for stretch in calls] for i in range(len(positions))]
        parents = [stretch[0].parent if stretch else None for stretch in calls]
        if all(parent is not None and stretch == self.children(parent, side)
               for parent, stretch in zip(parents, calls)):
            options.append([parent for parent in parents if parent is not None])
        return options

    def _same_inputs(self, instances: list[tuple[Item, Item]]) -> bool:
        """Same sizes in every instance, the same input values in some instance, and no result found elsewhere."""
        agree = False
        for x, y in instances:
            if not (isinstance(x, Node) and isinstance(y, Node)) or not self._same_sizes(x, y) \
                    or main_output(x) is None:
                return False
            if self.values.best(x.inputs(), y.inputs()) >= 0.75:
                if self._elsewhere(x, "a") or self._elsewhere(y, "b"):
                    return False
                agree = True
        return agree

    def _elsewhere(self, node: Node, side: str) -> bool:
        """Does the main output of ``node`` go into, or come out of, some call of the other side's scope?"""
        output = main_output(node)
        scope = node.parent
        while scope is not None and id(scope) not in self._partner:
            scope = scope.parent
        if output is None or scope is None:
            return False
        other = self._partner[id(scope)]
        for call in other.walk()[1:]:
            for found in call.tensors:
                if (self.values.similarity(output, found) if side == "a"
                        else self.values.similarity(found, output)) >= 0.75:
                    return True
        return False

    def _namesakes(self, a: Node, b: Node) -> list[tuple[Node, Node, str]] | None:
        """The forward children of ``a`` and ``b`` paired by (renamed) path and call index, in order, when every
        child has its namesake; None otherwise."""
        if not self.use_names:
            return None
        kids_a = [c for c in a.children if c.phase == "forward"]
        kids_b = [c for c in b.children if c.phase == "forward"]
        if len(kids_a) != len(kids_b):
            return None
        out = []
        for x, y in zip(kids_a, kids_b):
            renamed = apply_rename(x.relative_path, self.rules) if self.rules else x.relative_path
            if renamed != y.relative_path or x.call_index != y.call_index:
                return None
            out.append((x, y, "map" if renamed != x.relative_path else "name"))
        return out

    def _add(self, a: Node, b: Node, how: str) -> None:
        self.pairs.append((a, b))
        self.evidence.append(how)

    def _wraps(self, item: Item, side: str) -> bool:
        return isinstance(item, Node) and bool(self.children(item, side))

    def _dissolve(self, line: list[Item], positions: list[int], side: str) -> list[Item]:
        if not positions:
            return line
        out: list[Item] = []
        for position, item in enumerate(line):
            if position in positions and isinstance(item, Node):
                out += self._items(self.children(item, side), item)
            else:
                out.append(item)
        return out

    # --- the line-up -------------------------------------------------------------------------------------

    def _line_up(self, lines_a: list[list[Item]], lines_b: list[list[Item]]
                 ) -> tuple[list[tuple[int, int, str]], float]:
        """The order-keeping pairing of the items with the largest total score (instances' evidence pooled),
        and that score. Items whose names (or the map) agree anchor it; only the gaps between anchors are
        scored pair by pair, so two traces whose names line up pair in linear time."""
        n, m = len(lines_a[0]), len(lines_b[0])
        out: list[tuple[int, int, str]] = []
        total = 0.0
        last_j = last_k = -1
        for j, k, how in [*self._anchors(lines_a[0], lines_b[0]), (n, m, "")]:
            found, score = self._line_up_gap(lines_a, lines_b, range(last_j + 1, j), range(last_k + 1, k))
            out += found
            total += score
            if how:
                out.append((j, k, how))
                total += _NAMED
            last_j, last_k = j, k
        return out, total

    def _anchors(self, line_a: list[Item], line_b: list[Item]) -> list[tuple[int, int, str]]:
        """Items of A whose (renamed) path is an item of B's, in increasing order on both sides."""
        if not self.use_names:
            return []
        where_b = {_key(item, None): k for k, item in enumerate(line_b)}
        out: list[tuple[int, int, str]] = []
        for j, item in enumerate(line_a):
            key = _key(item, self.rules)
            k = where_b.get(key, -1)
            if k > (out[-1][1] if out else -1):
                out.append((j, k, "map" if key != _key(item, None) else "name"))
        return out

    def _line_up_gap(self, lines_a: list[list[Item]], lines_b: list[list[Item]], rows: range, columns: range
                     ) -> tuple[list[tuple[int, int, str]], float]:
        if not rows or not columns:
            return [], 0.0
        n, m = len(rows), len(columns)
        scores: dict[tuple[int, int], tuple[float, str]] = {}
        for j in range(n):
            for k in range(m):
                found = self._score_items([line[rows[j]] for line in lines_a], [line[columns[k]] for line in lines_b])
                if found is not None and found[0] >= _MIN_SCORE:
                    near = abs(j / n - k / m)  # ties go to the nearer position
                    scores[j, k] = (found[0] - 1e-3 * near, found[1])
        if not scores:
            return [], 0.0
        best = [[0.0] * (m + 1) for _ in range(n + 1)]
        for j in range(n - 1, -1, -1):
            for k in range(m - 1, -1, -1):
                take = scores[j, k][0] + best[j + 1][k + 1] if (j, k) in scores else -1.0
                best[j][k] = max(take, best[j + 1][k], best[j][k + 1])
        out: list[tuple[int, int, str]] = []
        j = k = 0
        while j < n and k < m:
            if (j, k) in scores and best[j][k] == scores[j, k][0] + best[j + 1][k + 1]:
                out.append((rows[j], columns[k], scores[j, k][1]))
                j, k = j + 1, k + 1
            elif best[j][k] == best[j + 1][k]:
                j += 1
            else:
                k += 1
        return out, best[0][0]

    def _score_items(self, xs: list[Item], ys: list[Item]) -> tuple[float, str] | None:
        found: list[tuple[float, str]] = []
        for x, y in zip(xs, ys):
            if isinstance(x, Repeated) != isinstance(y, Repeated):
                return None
            if isinstance(x, Repeated) and isinstance(y, Repeated):
                pairs = _instances(x, y)
                if not pairs:
                    return None
                named = self._names(x.prefix, y.prefix)
                if named is not None:
                    return named
                scored = [self._score(a, b) for a, b in pairs]
                kept = [s for s in scored if s is not None and s is not _VETO]
                if kept:
                    score, how = max(kept)
                    return score + 1.0, how  # a whole structure pairs before any one call
                if len(x.members) == len(y.members) and self._same_sizes(*pairs[0]):
                    return 1.0, "shape"  # as many instances, of the same sizes: the structure, whatever its values
                return None
            assert isinstance(x, Node) and isinstance(y, Node)
            one = self._score(x, y)
            if one is _VETO:
                return None  # what one instance rules out, the line-up of every instance rules out
            if one is not None:
                found.append(one)
        return max(found) if found else None  # evidence seen in any instance counts (a bug hides it in one)

    def _names(self, path_a: str, path_b: str) -> tuple[float, str] | None:
        """The map's or the names' pair of two paths, or None."""
        if not self.use_names:
            return None
        renamed = apply_rename(path_a, self.rules) if self.rules else path_a
        if renamed == path_b:
            return _NAMED, "map" if renamed != path_a else "name"
        return None

    @staticmethod
    def _same_sizes(x: Node, y: Node) -> bool:
        return _sizes(x) == _sizes(y)

    def _score(self, x: Node, y: Node) -> tuple[float, str] | None:
        """How strongly call ``x`` of A and ``y`` of B are the same computation; None when they cannot be."""
        named = self._names(x.relative_path, y.relative_path)
        if named is not None:
            return named
        leaf_x, leaf_y = not self.children(x, "a"), not self.children(y, "b")
        out_x, out_y = main_output(x), main_output(y)
        in_x, in_y = x.inputs(), y.inputs()
        same_out = out_x is not None and out_y is not None and numel(out_x) == numel(out_y)
        ids_only = _ids_only(in_x, in_y)
        same_in = [numel(t) for t in in_x[:1]] == [numel(t) for t in in_y[:1]] or ids_only
        out_sim = self.values.similarity(out_x, out_y) if out_x is not None and out_y is not None and same_out \
            else 0.0
        in_sim = self.values.best(in_x, in_y)
        if out_sim and in_x and in_y and in_sim < 0.4 and not (leaf_x and leaf_y):
            out_sim = 0.0  # the same result from other inputs: a wrapper reaching the point another call reaches
        local_x, local_y = _local(x), _local(y)
        same_name = self.use_names and local_x == local_y
        names = name_similarity(local_x, local_y) if self.use_names else 0.0
        kinds = type_similarity(x.module_type, y.module_type)
        if leaf_x and leaf_y:
            if same_out and not same_in and out_sim >= 0.75 and in_x and in_y:
                # the same result from inputs of other sizes: transformers' BLOOM ``mlp.dense_4h_to_h`` (the
                # activation in) and transformer-lens's ``mlp`` (the hidden state in)
                return 1.0 + 3.0 * out_sim + 0.5 * kinds + 0.5 * names, OUTPUTS_ONLY
            # two calls that call nothing: the same sizes, and something more than sizes (values in or out,
            # a name or a kind of module in common)
            # (or both read the token ids alone: an embedding lookup, whose values a wrong table hides)
            if not (same_out and same_in) or not (out_sim >= 0.4 or in_sim >= 0.75 or kinds or names or ids_only):
                return None
            if len(in_x) != len(in_y) and out_sim < 0.4 and not kinds and not same_name and not ids_only:
                # another number of tensors in, another kind, another result: transformers' ``act_fn(gate)``
                # and mlx-lm's ``SwiGLU(up, gate)``, which multiplies inside the call
                return None
            how = "value" if out_sim >= 0.75 else "name" if same_name else "shape"
            if out_sim >= 0.4 and in_x and in_y and in_sim < 0.4:
                # one result from other inputs: what feeds each differs, by design. The outputs agree at any
                # grade (a quantized run agrees with its reference only to about 1e-2, the 0.4 grade): the
                # inputs are told apart by the same evidence in every instance of a structure, whatever its
                # rounding has piled up to
                how = OUTPUTS_ONLY
            return 1.0 + 3.0 * out_sim + in_sim + 0.5 * kinds + 0.5 * names, how
        if same_out and same_in and out_sim >= 0.4:
            return 2.0 + 3.0 * out_sim + in_sim + kinds + names, "value"
        if names >= 0.5 and same_in:  # ``attn`` and ``self_attn``, ``decoder`` and ``model.decoder``
            if in_sim >= 0.75 and out_sim < 0.4 and (self._elsewhere(x, "a") or self._elsewhere(y, "b")):
                return _VETO  # same inputs, and its result comes out of another call: not the same computation
            return 1.5 + in_sim + kinds + names, "name"
        return None


def _ids_only(in_x: list[TensorRecord], in_y: list[TensorRecord]) -> bool:
    """One side reads nothing the trace holds (a graph node reading a weight and the prompt, both kept outside
    it: llama.cpp's ``embd``) and the other only integers (the token ids): neither has an input to compare."""
    def integers(records: list[TensorRecord]) -> bool:
        return bool(records) and all("int" in (r.dtype or "") for r in records)
    return (not in_x and integers(in_y)) or (not in_y and integers(in_x))


def _closest(candidates: list[tuple[float, int]]) -> int | None:
    """The candidate whose values agree best, ranked by distance, not by a tolerance: a quantized run (Q8_0
    rounds the matmul inputs to 8-bit blocks) agrees with its reference to about 1e-2 only, with every
    candidate, so no threshold tells the right one, while the ranking does. It wins when it agrees at all
    (graded above 0) and the runner-up is more than ``_CLEAR`` times farther: the winner's own distance
    is the runs' noise, which moves the runner-up's by as much, so noise alone cannot swap the two. None
    when no candidate clearly wins (two calls of A with the same values: values cannot tell them apart)."""
    ranked = sorted(candidates)
    if not ranked or not graded(ranked[0][0]):
        return None
    if len(ranked) > 1 and ranked[1][0] <= _CLEAR * ranked[0][0]:
        return None
    return ranked[0][1]


def _fed_forward(producers: list[set[int]], agreed: dict[int, int], placed: set[int]) -> dict[int, int]:
    """The nodes of a graph block's line that agree with no call and feed one: for each, the position in A's
    line of the call whose values its chain of continuations reaches (each the one node of the line that reads
    the node before it alone) before any other node agreeing with a call."""
    continuations: dict[int, list[int]] = {}
    for c, found in enumerate(producers):
        if len(found) == 1:
            continuations.setdefault(next(iter(found)), []).append(c)
    out: dict[int, int] = {}
    for i in range(len(producers) - 1, -1, -1):
        if i in agreed or i in placed or len(continuations.get(i, ())) != 1:
            continue
        (c,) = continuations[i]
        if c in agreed:
            out[i] = agreed[c]
        elif c in out:
            out[i] = out[c]
    return out


def _line_producers(line: list[Item]) -> list[set[int]]:
    """For each item of a graph block's line, the positions in the line of the nodes whose outputs it read
    (the same payload), through the block's nodes that are not in the line (those that compute nothing)."""
    position = {id(item): i for i, item in enumerate(line)}
    parents = {id(item.parent): item.parent for item in line if isinstance(item, Node) and item.parent is not None}
    made: dict[str, Node] = {}
    for parent in parents.values():
        for sibling in parent.children:
            for record in sibling.outputs():
                if record.payload:
                    made.setdefault(record.payload, sibling)
    out: list[set[int]] = []
    for item in line:
        found: set[int] = set()
        todo = [item] if isinstance(item, Node) else []
        seen = {id(item)}
        while todo:
            for record in todo.pop().inputs():
                producer = made.get(record.payload) if record.payload else None
                if producer is None or id(producer) in seen:
                    continue
                seen.add(id(producer))
                if id(producer) in position:
                    found.add(position[id(producer)])
                else:
                    todo.append(producer)
        out.append({p for p in found if p < position[id(item)]} if isinstance(item, Node) else found)
    return out


def _sizes(node: Node) -> tuple[int | None, int | None]:
    inputs = node.inputs()
    return numel(inputs[0]) if inputs else None, numel(main_output(node))


def _repeats(members: list[Node]) -> bool:
    """Numbered siblings that are instances of one structure: one class, or one size in and out and the same
    submodules (a block rewritten in one layer is still an instance; a ``Sequential`` of different layers is
    not, nor T5's ``layer.0`` attention and ``layer.1`` feed-forward, of one size)."""
    if len(members) < 2:
        return False
    if len({m.module_type for m in members}) == 1:
        return True
    return len({_sizes(m) for m in members}) == 1 and len({_submodules(m) for m in members}) == 1


def _submodules(node: Node) -> tuple[str, ...]:
    """The local names of a call's forward children, in call order."""
    return tuple(_local(c) for c in node.children if c.phase == "forward")


def _key(item: Item, rules: RenameRules | None) -> tuple[str, int]:
    """What names an item: its (renamed) path and call index; a repeated structure by its prefix."""
    path, index = (item.prefix, -1) if isinstance(item, Repeated) else (item.relative_path, item.call_index)
    return (apply_rename(path, rules) if rules else path), index


def _local(node: Node) -> str:
    """The last component of a call's path that is not a number (``layers.0.self_attn`` -> ``self_attn``)."""
    parts = [p for p in node.relative_path.split(".") if not p.isdigit()]
    return parts[-1] if parts else ""


def _instances(x: Repeated, y: Repeated) -> list[tuple[Node, Node]]:
    """Instance N of A with instance N of B (a pruned trace lacks some numbers: those pair with nothing)."""
    by_number = dict(zip(y.numbers, y.members))
    return [(a, by_number[n]) for n, a in zip(x.numbers, x.members) if n in by_number]


def _shape_of(line: list[Item], parent: Node) -> list[tuple[str, int]]:
    """A line-up as paths relative to its scope's call, to compare the instances of a repeated structure."""
    cut = len(parent.relative_path) + 1 if parent.relative_path else 0
    out = []
    for item in line:
        if isinstance(item, Repeated):
            out.append((item.prefix[cut:] + ".N", len(item.members)))
        else:
            out.append((item.relative_path[cut:], item.call_index))
    return out


def _same_template(lines: list[list[Item]], scope: list[tuple[Node, Node]], side: int) -> bool:
    first = _shape_of(lines[0], scope[0][side])
    return all(_shape_of(line, pair[side]) == first for line, pair in zip(lines[1:], scope[1:]))
