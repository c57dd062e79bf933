#!/usr/bin/env bash
# The whole test suite under each numeric environment that changes how float32 rounds or how many threads run:
# torch's SIMD level, the BLAS library's reproducibility mode, the thread count. One run after another (each
# takes the whole machine); a summary line per setting in env-matrix/summary.txt, the full logs beside it.
#
#   scripts/env_matrix.sh                 # every setting below
#   scripts/env_matrix.sh MKL_CBWR=AVX2   # the ones named
#
# ATEN_CPU_CAPABILITY=avx512 needs a CPU with AVX-512 (torch stops with an illegal instruction without it):
# it is run only where the CPU's flags have it.
set -uo pipefail
cd "$(dirname "$0")/.."
out=env-matrix
mkdir -p "$out"
settings=("$@")
if [ ${#settings[@]} -eq 0 ]; then
  settings=(ATEN_CPU_CAPABILITY=default ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 MKL_CBWR=COMPATIBLE
            OMP_NUM_THREADS=1 OMP_NUM_THREADS=2)
  grep -qw avx512f /proc/cpuinfo && settings+=(ATEN_CPU_CAPABILITY=avx512)
fi
python3 scripts/machine_line.py | tee -a "$out/summary.txt"
status=0
for setting in "${settings[@]}"; do
  log="$out/$(echo "$setting" | tr '=' '_').log"
  start=$(date +%s)
  env "$setting" python -m pytest -q -p no:cacheprovider > "$log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  echo "$setting: exit $rc in $(( $(date +%s) - start )) s: $(tail -n 1 "$log")" | tee -a "$out/summary.txt"
done
exit $status
