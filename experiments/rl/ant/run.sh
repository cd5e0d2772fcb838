#!/usr/bin/env bash
# Ant (diffmech.rl.Ant, frame skip 5 x 0.01 s): stable-baselines3's SAC, sample-enhanced SAC and SHAC, each
# for the same training wall-clock budget (WALL seconds, evaluations excluded), seeds given on the command
# line. Episodes of 100 steps (5 s) instead of the task's 1000, for the budget: an evaluation of 2 episodes
# of 1000 steps costs minutes here. One torch thread each; the 2-core machine is shared with other jobs.
#   experiments/rl/ant/run.sh OUT WALL SEED...
set -euo pipefail
R=${1:-experiments/rl/ant}; WALL=${2:-300}; shift 2 || true
SEEDS=${*:-0}
COMMON=(--env ant --steps 1000000 --max-wall "$WALL" --evaluations 8 --eval-episodes 2 --env-set horizon=100
        --no-progress)
for s in $SEEDS; do
  diffmech rl train "${COMMON[@]}" --algo shac --seed "$s" --out "$R/shac_s$s" --set num_envs=16 --set horizon=16
  diffmech rl train "${COMMON[@]}" --algo sac --seed "$s" --out "$R/sac_s$s"
  diffmech rl train "${COMMON[@]}" --algo sample-enhanced-sac --seed "$s" --out "$R/sesac_s$s" \
    --set learning_starts=200 --set extra_samples=4
done
