#!/usr/bin/env bash
# Section 5 of issue 11 at a reduced budget (N = 32 training trajectories, 300 epochs instead of 2000):
# dissipation on the damped pendulum, the chaotic double pendulum, and a 3-DoF arm loaded from URDF.
# Run from the repository root; each sweep resumes where it stopped.
set -euo pipefail
E=${EPOCHS:-300}
W=${WORKERS:-2}
run() { nice -n 10 python -m diffmech symo sweep --n-ics 32 --epochs "$E" --workers "$W" "$@"; }
# dissipation: conservative models vs the same with a learned Rayleigh dissipation matrix
run --system damped_pendulum --models node-rk4,lnode-rk4,symo,e2e-symo --out experiments/symo/damped_pendulum
run --system damped_pendulum --models lnode-rk4,symo,e2e-symo --dissipation \
    --out experiments/symo/damped_pendulum_dissipation
# systems beyond the paper
run --system double_pendulum --out experiments/symo/double_pendulum
run --system arm3 --out experiments/symo/arm3
for d in damped_pendulum damped_pendulum_dissipation double_pendulum arm3; do
    python -m diffmech symo figures "experiments/symo/$d" --n-ics 32
done
