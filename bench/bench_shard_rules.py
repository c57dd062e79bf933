"""Time declared layouts at their bound: a ``--shards`` file of 1,024 rules placed over a multi-rank trace.

    python bench/bench_shard_rules.py traces/tp2 [--rules 1024] [--repeats 3]

The rules are the worst case for matching: every rule covers every output slot, and all but the last match
no module (``*0 outputs: replicated``, ``*1 ...``), so each output of the trace is tried against each glob
before the last rule (``*act_fn outputs: dim -1 over tp``) places the ``act_fn`` outputs. Printed: the median
time to parse the rules and read the folder with them (``load_sharded``), and the time to read it without.
Any multi-rank capture of a Llama works, such as ``tests/distributed/tp_run.py``'s ``torch_none``.
"""

from __future__ import annotations

import argparse
import statistics
import time

from tracediff.sharding import load_sharded, parse_rules


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--rules", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    text = "".join(f"*{i} outputs: replicated\n" for i in range(args.rules - 1)) + \
        "*act_fn outputs: dim -1 over tp\n"
    with_rules, without = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        trace = load_sharded(args.folder, shards=parse_rules(text, "rules"))
        with_rules.append(time.perf_counter() - start)
        start = time.perf_counter()
        load_sharded(args.folder)
        without.append(time.perf_counter() - start)
    records = sum(len(node.tensors) for node in trace.nodes())
    print(f"{records} tensors, {args.rules} rules: {statistics.median(with_rules):.2f} s with the rules, "
          f"{statistics.median(without):.2f} s without (median of {args.repeats})")


if __name__ == "__main__":
    main()
