#!/usr/bin/env bash
# The emulated validation runs behind results/emulation/ (needs root; ~30 min on 2 cores, keep the
# machine otherwise idle: the runtime's compute and the delayer share the cores).
# Each line: one emulated network (a subset of a paper case, bandwidth x0.1), the scheduled layout
# and 2 random layouts on it; every run's row holds the simulator's prediction for the same
# scaled cluster, layout and measured per-stage compute.
set -uo pipefail  # one failed setting (e.g. a link off target) does not stop the rest
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
out=${1:-results/emulation}
common="mode=emulate model=debug study=emulation results_dir=$out iters=6"
python repro/run.py $common case=5 'emulate.devices=[0,8,24,40]' batch=8
python repro/run.py $common case=5 'emulate.devices=[0,8,24,40]' batch=16
python repro/run.py $common case=5 'emulate.devices=[0,8,24,40]' batch=8 emulate.hidden_size=512
python repro/run.py $common case=4 'emulate.devices=[0,16,32,48]' batch=8
python repro/run.py $common case=5 pp=4 dp=2 batch=8
python repro/run.py $common case=5 pp=2 dp=4 batch=8
python repro/run.py $common case=4 'emulate.devices=[0,1,16,17,32,33,48,49]' pp=4 dp=2 batch=8
python repro/emulation_report.py "$out"
