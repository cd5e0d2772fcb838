#!/usr/bin/env bash
# SHAC on the Ant with windows of 4 steps (0.2 s): 64 environments, 300,000 environment steps, 20
# evaluations of 2 episodes of 100 steps, the seeds given (run side by side, one torch thread each).
# Longer windows are what failed before: the gradient of a window's return w.r.t. the policy grows with
# its length through the contacts (EXPERIMENTS.md, "The Ant").
#   experiments/rl/ant/run_shac_h4.sh OUT SEED...
set -euo pipefail
R=${1:-experiments/rl/ant}; shift || true
SEEDS=${*:-"0 1 2"}
for s in $SEEDS; do
  diffmech rl train --env ant --algo shac --steps 300000 --evaluations 20 --eval-episodes 2 --env-set horizon=100 \
    --set num_envs=64 --set horizon=4 --seed "$s" --out "$R/shac64_h4_s$s" --no-progress &
done
wait
