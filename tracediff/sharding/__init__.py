"""Sharded runs: a multi-rank folder (``capture(..., ranks="all")`` under torchrun) read as one global trace.

::

    import tracediff

    result = tracediff.align("traces/tp1", "traces/tp2")   # zero options: layouts come from the trace
    for finding in result.shard_findings:                  # ranks that disagree on a replica, unplaced tensors
        print(finding.describe())
    row = result.first_divergence
    print(row.describe(), row.rank)                        # the rank whose shard first goes out of tolerance

:func:`load_sharded` reads the folder (``rank{r}/`` plus ``tracediff_ranks.json``), checks that the ranks are
one run, and returns a :class:`ShardedTrace` whose records are the global tensors, rebuilt from the shards one
at a time when read. ``shards=`` (the command line's ``--shards``) declares layouts the trace lacks
(:mod:`tracediff.sharding.rules`). See ``docs/distributed.md``.
"""

from __future__ import annotations

from ..trace.ranks import is_multi_rank
from .findings import ShardFinding
from .rules import ShardRules, parse_rules, read_rules
from .trace import ShardedTrace, load_sharded

__all__ = ["ShardFinding", "ShardRules", "ShardedTrace", "is_multi_rank", "load_sharded", "parse_rules",
           "read_rules"]

