"""Several ``tracediff align --distributed`` runs in one torchrun launch (start-up paid once).

    torchrun --nproc-per-node 2 tests/distributed/align_run.py OUT REF RULES NAME=FOLDER ...   # RULES "-": none

The process group is started here, so ``align`` joins it and leaves it open between runs. Each rank runs the
command line in-process for each NAME and writes its exit code to ``OUT/NAME.rank{r}.code``; rank 0 also
writes the JSON report ``OUT/NAME.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch.distributed as dist

from tracediff.cli.main import main as tracediff_main


def main(argv: list[str]) -> None:
    out, ref, rules = Path(argv[0]), argv[1], argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for case in argv[3:]:
        name, folder = case.split("=", 1)
        shards = ["--shards", rules] if rules != "-" else []
        code = tracediff_main(["align", ref, folder, *shards, "--distributed", "--format", "json", "-o",
                               str(out / f"{name}.json")])
        (out / f"{name}.rank{rank}.code").write_text(str(code))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
