#!/usr/bin/env bash
# The real-baseline runs behind results/baselines/ (2 busy CPU cores; the emulated part needs root).
# loopback4/: Megatron and DeepSpeed grids on 4 local gloo ranks (~12 min).
# emulated/:  the same grids inside engineer D's emulated case-5 / case-4 subsets, matching the
#             settings of results/emulation/run.sh (batch 8, emulate.* defaults; ~40 min).
# Then COMPARISON.md: ours vs the best grid points, each beside the simulator's prediction.
set -uo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
for s in megatron deepspeed; do
  python repro/run.py mode=train system=$s model=debug grid=true grid_devices=4 \
    'grid_micro_batch_sizes=[1,2]' iters=4 study=baselines results_dir=results/baselines/loopback4
done
for c in "5 [0,8,24,40]" "4 [0,16,32,48]"; do
  set -- $c
  for s in megatron deepspeed; do
    python repro/run.py mode=emulate system=$s model=debug grid=true 'grid_micro_batch_sizes=[1,2]' \
      case=$1 "emulate.devices=$2" batch=8 iters=4 study=baselines results_dir=results/baselines/emulated
  done
done
python results/baselines/compare.py
