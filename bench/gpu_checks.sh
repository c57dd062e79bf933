#!/usr/bin/env bash
# The CUDA checks and benchmarks of docs/performance.md, in one run on a machine with one CUDA device:
#
#     bash bench/gpu_checks.sh OUTDIR
#
# Run from the repository root, with tracediff's dependencies importable (PYTHONPATH is extended with the
# checkout). Each step's output goes to OUTDIR (device.txt, tests.txt, capture_gpu.*, align_gpu.txt,
# summary_long.txt, capture_cpu.txt) as it runs, so a run stopped early keeps what it measured.
set -uo pipefail
out=${1:?usage: bash bench/gpu_checks.sh OUTDIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python3}
step() { echo; echo "=== $1 ($(date +%T))"; }

step "device"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
  $py -c "import os, torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
torch.cuda.get_device_name(), 'cpus', os.cpu_count(), 'threads', torch.get_num_threads())"
  df -h /tmp | tail -1
} 2>&1 | tee "$out/device.txt"

step "CUDA tests"
$py -m pytest -q -p no:cacheprovider tests/capturing/test_cuda.py tests/capturing/test_pipeline.py \
  tests/capturing/test_device_stats.py tests/capturing/test_fused_stats.py 2>&1 | tee "$out/tests.txt" | tail -15

step "capture on the GPU (preset gpu, bfloat16)"
$py bench/bench_capture.py --preset gpu --device cuda --dtype bfloat16 --repeats 5 --floors --no-memory \
  --configs plain,full_sync,full_w2,summary,summary_unfused,summary_nostats,hf --out-root /tmp/td-capture \
  --json "$out/capture_gpu.json" 2>&1 | tee "$out/capture_gpu.txt" | tail -14

step "align of a GPU-made pair (bfloat16, written by tracediff.capture on the GPU)"
$py bench/bench_align.py --device cuda --dtype bfloat16 --capture tracediff --size-mb 500 --repeats 3 --cli \
  --work /tmp/td-align 2>&1 | tee "$out/align_gpu.txt" | tail -14
rm -rf /tmp/td-align

step "summary capture on the GPU, sequence 8192"
$py bench/bench_capture.py --preset gpu --device cuda --dtype bfloat16 --seq-len 8192 --repeats 5 --no-memory \
  --configs plain,summary,summary_unfused,summary_nostats --out-root /tmp/td-capture 2>&1 \
  | tee "$out/summary_long.txt" | tail -8

step "capture on this machine's CPU (preset cpu, float32)"
$py bench/bench_capture.py --repeats 7 --floors --no-memory --configs full_sync,full_w1,full_w2,summary \
  --out-root /tmp/td-capture 2>&1 | tee "$out/capture_cpu.txt" | tail -12
step "done"
