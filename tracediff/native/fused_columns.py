"""The layout of the compiled pass's output, shared by its two builds (``fused.py`` with numba, ``fused_pass.c``
in C) and by :mod:`tracediff.compare.kernel`, which merges it: one row of ``COLUMNS`` float64 per chunk."""

FINITE, MAX_ABS, MAX_REL, SUM_ABS, SUM_SQ, DOT, NORM_A, NORM_B = range(8)
NAN_MISMATCH, INF_MISMATCH, FAILED_RULE, FAILED_EXCESS, NONFINITE_FAILED, CLEAN = range(8, 14)
MOMENT_N, MEAN_A, MEAN_B, M2_A, M2_B, C_AB = range(14, 20)
COLUMNS = 20
STATS_COLUMNS = 9  # a tensor's statistics per chunk (``td_stats``), also ``capturing/stats.py``'s ``wide_partials``
BLOCK = 2048  # elements per block: 16 KiB of a float32 pair, 32 KiB of a float64 one (stays in the L1 cache)
