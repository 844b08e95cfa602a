#!/usr/bin/env bash
# Registered out-of-sample validation (needs root for the emulation; 2 cores). Steps in order;
# commit after steps 2 and as rows come in step 3 (the score checks that order in git).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
out=results/validation
# 1. compute calibration: every stage shape, one process per emulated device, all at once
python -m repro.validation.profile $out/settings.json $out/compute_profile.json --repeats 6 --nice -10
# 2. predictions (layouts fixed, git revision inside) -> commit $out/predictions.json now
python repro/run.py mode=predict results_dir=$out
# 3. three repeats per setting, fresh namespaces and verified links each; resumable
python -m repro.validation.measure $out/predictions.json --out $out/measured.csv --repeats 3 --nice -10
# 4. score (refuses unless 2 was committed before 3's rows)
python -m repro.validation.score $out/predictions.json $out/measured.csv --out $out
