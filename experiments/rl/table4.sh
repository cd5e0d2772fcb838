#!/usr/bin/env bash
# The seed's Table 4 with SHAC: n = 1..7 links, several seeds, one torch thread per run, P runs at a time
# (niced; the 2-core development machine is shared). Then the markdown table of experiments/rl/table4.py.
#   bash experiments/rl/table4.sh [DIR]          # SEEDS="0 1 2" LINKS="1 2 3 4 5 6 7" P=2 by default
set -euo pipefail
R=${1:-experiments/rl/table4}
SEEDS=${SEEDS:-"0 1 2"}
LINKS=${LINKS:-"1 2 3 4 5 6 7"}
P=${P:-2}
# seed-major order: a run cut short still covers every n with the first seeds
steps() { case $1 in 1) echo 200000;; 2) echo 300000;; *) echo 600000;; esac; }
mkdir -p "$R"
for s in $SEEDS; do for n in $LINKS; do
  [ -f "$R/shac_n${n}_s$s/metrics.json" ] && continue
  echo "nice -n 10 diffmech rl train --env nlink-reach --links $n --algo shac --steps $(steps "$n") --evaluations 200 \
--seed $s --out $R/shac_n${n}_s$s --no-progress > /dev/null"
done; done | xargs -P "$P" -I{} bash -c "{}"
python experiments/rl/table4.py "$R"
