#!/usr/bin/env bash
# Ant (diffmech.rl.Ant, frame skip 5 x 0.01 s): stable-baselines3's SAC, sample-enhanced SAC and SHAC, each
# for the same training wall-clock budget (WALL seconds, evaluations excluded), seeds given on the command
# line. Episodes of 100 steps (5 s) instead of the task's 1000, for the budget: an evaluation of 2 episodes
# of 1000 steps costs minutes here. One torch thread each; the 2-core machine is shared with other jobs.
#   experiments/rl/ant/run.sh OUT WALL SEED...
# Longer single runs (seed 0, WALL2 seconds, default 900): SHAC with 64 environments per window and SAC, side by side:
#   WALL2=900 experiments/rl/ant/run.sh OUT 0 long
set -euo pipefail
R=${1:-experiments/rl/ant}; WALL=${2:-300}; shift 2 || true
SEEDS=${*:-0}
if [ "$SEEDS" = "long" ]; then
  W=${WALL2:-900}
  LONG=(--env ant --steps 10000000 --max-wall "$W" --evaluations 8 --eval-episodes 2 --env-set horizon=100 --no-progress)
  diffmech rl train "${LONG[@]}" --algo shac --seed 0 --out "$R/shac64_long_s0" --set num_envs=64 --set horizon=16 &
  diffmech rl train "${LONG[@]}" --algo sac --seed 0 --out "$R/sac_long_s0" &
  wait
  exit 0
fi
COMMON=(--env ant --steps 1000000 --max-wall "$WALL" --evaluations 8 --eval-episodes 2 --env-set horizon=100
        --no-progress)
for s in $SEEDS; do
  diffmech rl train "${COMMON[@]}" --algo shac --seed "$s" --out "$R/shac_s$s" --set num_envs=16 --set horizon=16
  diffmech rl train "${COMMON[@]}" --algo sac --seed "$s" --out "$R/sac_s$s"
  diffmech rl train "${COMMON[@]}" --algo sample-enhanced-sac --seed "$s" --out "$R/sesac_s$s" \
    --set learning_starts=200 --set extra_samples=4
done
