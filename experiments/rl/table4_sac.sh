#!/usr/bin/env bash
# The seed's Table 4 rows of the sample-based learners at a reduced budget: stable-baselines3's SAC (the
# model-free baseline, unchanged) and diffmech's policy-enhanced SAC, both with 64x64 networks, for
# 10,000 n environment steps (a tenth of the seed's 100 n epochs of 1,000 samples), 20 evaluations;
# one run at a time, one torch thread, niced. Then the markdown tables of experiments/rl/table4.py.
#   SEEDS="0 1 2 3 4" LINKS="1 2 3" bash experiments/rl/table4_sac.sh [DIR]
set -euo pipefail
R=${1:-experiments/rl/table4}
SEEDS=${SEEDS:-"0 1 2 3 4"}
LINKS=${LINKS:-"1 2 3"}
mkdir -p "$R"
for s in $SEEDS; do for n in $LINKS; do for a in sac policy-enhanced-sac; do
  d="$R/${a}_n${n}_s$s"
  [ -f "$d/metrics.json" ] && continue
  if [ "$a" = sac ]; then net='policy_kwargs={"net_arch": [64, 64]}'; else net='hidden=[64, 64]'; fi
  nice -n 10 diffmech rl train --env nlink-reach --links "$n" --algo "$a" --steps $((10000 * n)) \
    --evaluations 20 --set "$net" --seed "$s" --out "$d" --no-progress > /dev/null
done; done; done
for a in sac policy-enhanced-sac; do python experiments/rl/table4.py "$R" --algo "$a"; done
