#!/usr/bin/env bash
# The emulated validation runs behind results/emulation/ (needs root; ~20 min on 2 busy cores).
# Each line: one emulated network, the scheduled layout + 2 random layouts on it.
set -uo pipefail  # one failed setting (e.g. a link off target) does not stop the rest
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
out=${1:-results/emulation}
common="mode=emulate model=debug study=emulation results_dir=$out iters=4"
python repro/run.py $common case=5 'emulate.devices=[0,8,24,40]' batch=8
python repro/run.py $common case=5 'emulate.devices=[0,8,24,40]' batch=16
python repro/run.py $common case=4 'emulate.devices=[0,16,32,48]' batch=8
python repro/run.py $common case=5 pp=4 dp=2 batch=8
python repro/run.py $common case=4 'emulate.devices=[0,1,16,17,32,33,48,49]' pp=4 dp=2 batch=8
python repro/emulation_report.py "$out"
