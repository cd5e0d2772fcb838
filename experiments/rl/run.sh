#!/usr/bin/env bash
# n-link reaching (seed 002, section 6.2): SHAC for links = 1, 2, 3 (seed 0), then stable-baselines3's SAC
# with the same training wall-clock budget; policy-enhanced SAC at n = 2 likewise. One torch thread each,
# run one after another on the 2-core development machine (shared with other jobs: wall times are loose).
set -euo pipefail
R=${1:-experiments/rl}
for n in 1 2 3; do
  steps=300000; [ "$n" = 3 ] && steps=600000
  diffmech rl train --env nlink-reach --links "$n" --algo shac --steps "$steps" --seed 0 --out "$R/shac_n$n" --no-progress
  wall=$(python -c "import json; print(json.load(open('$R/shac_n$n/metrics.json'))['wall_s'])")
  diffmech rl train --env nlink-reach --links "$n" --algo sac --steps 1000000 --max-wall "$wall" --seed 0 \
    --out "$R/sac_n$n" --no-progress
done
wall=$(python -c "import json; print(json.load(open('$R/shac_n2/metrics.json'))['wall_s'])")
diffmech rl train --env nlink-reach --links 2 --algo policy-enhanced-sac --steps 1000000 --max-wall "$wall" --seed 0 \
  --out "$R/pesac_n2" --no-progress
diffmech rl train --env nlink-reach --links 2 --algo sac --steps 1000000 --max-wall 300 --seed 0 --out "$R/sac_n2_300s" --no-progress
diffmech rl eval "$R/shac_n2" --final
