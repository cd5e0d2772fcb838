#!/usr/bin/env bash
# stable-baselines3's SAC and diffmech's sample-enhanced SAC on the Ant for the training wall-clock that the
# SHAC runs of run_shac_h4.sh took (WALL seconds, evaluations excluded), three seeds of one learner side by
# side (as the SHAC runs ran), one torch thread each; episodes of 100 steps, 20 evaluations of 2 episodes.
#   experiments/rl/ant/run_sac_equal_wall.sh OUT WALL
set -euo pipefail
R=${1:-experiments/rl/ant}; WALL=${2:-900}
COMMON=(--env ant --steps 1000000 --max-wall "$WALL" --evaluations 20 --eval-episodes 2 --env-set horizon=100
        --no-progress)
for s in 0 1 2; do
  diffmech rl train "${COMMON[@]}" --algo sac --seed "$s" --out "$R/sac_w${WALL}_s$s" &
done
wait
for s in 0 1 2; do
  diffmech rl train "${COMMON[@]}" --algo sample-enhanced-sac --seed "$s" --out "$R/sesac_w${WALL}_s$s" \
    --set learning_starts=200 --set extra_samples=4 &
done
wait
