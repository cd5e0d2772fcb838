#!/usr/bin/env bash
# Reproduce the eigenmode experiments (seed 001) with the public CLI, one run at a time.
# Usage: experiments/eigenmodes/run.sh [PART ...]
#   (parts: main example effort periods pair period beyond fast appendix-fast)
# Results land in experiments/eigenmodes/<run>/ (metrics.json, stabilize*.json, figures; checkpoints are
# not committed). Set PY to the interpreter (default: python); NICE to a niceness (default 10).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python}
NICE=${NICE:-10}
OUT=experiments/eigenmodes
dm() { nice -n "$NICE" "$PY" -m diffmech eigenmode "$@" --no-progress 2>&1 | grep -v '^$' || true; }
dms() { nice -n "$NICE" "$PY" -m diffmech eigenmode "$@"; }
parts=${*:-main example effort periods pair period beyond fast appendix-fast}
for part in $parts; do
  case $part in
    main)     # section 5 of the paper: Table 1/2 values, T = 1.5 s (spec 2.8), 500 epochs x 7 steps
      dm learn --config main --out $OUT/main
      dms stabilize $OUT/main --gains 1 10
      dms stabilize $OUT/main --gains 10 10 --tag gains10-10
      dms stabilize $OUT/main --gains 1 10 --damping 0.5 --tag damping0.5 ;;
    example)  # the 2023 public example: T = 1.75 s, c = 1e-3, 700 epochs x 1 step
      dm learn --config example --out $OUT/example ;;
    effort)   # appendix B.1: grid over c, T = 1.5 s, 100 epochs x 7
      for c in 0 1e-5 1e-4 1e-3 1e-2 1e-1; do dm learn --config effort-sweep --effort $c --out $OUT/effort_c$c; done ;;
    periods)  # appendix B.2: several periods, c = 1e-4
      for T in 1.25 1.5 2.0 2.6 3.0; do dm learn --config periods --period $T --epochs 150 --out $OUT/period_T$T; done ;;
    pair)     # appendix C: q0 = (0, 0), target FK(1.5, 1.5)
      for T in 1.75 2.5 3.0; do dm learn --config other-pair --period $T --epochs 150 --out $OUT/pair_T$T; done ;;
    period)   # appendix D: the period learned jointly from T = 1.0
      dm learn --config learn-period --out $OUT/learnT_main
      dm learn --config learn-period-c --out $OUT/learnT_pair ;;
    beyond)   # any robot: a 3-link arm with elastic joints, two joints of the iiwa with a task-space target
      dm learn --config three-link --out $OUT/three_link
      dm learn --config iiwa --out $OUT/iiwa ;;
    fast)     # Adam, then the Gauss-Newton polish (and the effort descent in the *-effort configs)
      for c in main-fast main-fast-effort three-link-fast iiwa-fast iiwa-fast-effort; do
        dm learn --config $c --out $OUT/$c
      done
      dms stabilize $OUT/main-fast --gains 1 10 ;;
    appendix-fast)  # appendix runs with main-fast's schedule (no figures)
      A=$OUT/appendix-fast
      dm learn --config main-fast --q0 0 0 --target-angles 1.5 1.5 --period 1.75 --out $A/pair_T1.75 --no-plots
      dm learn --config main-fast --q0 0 0 --target-angles 1.5 1.5 --period 2.5 --out $A/pair_T2.5 --no-plots
      for T in 2.0 3.0; do dm learn --config main-fast --period $T --out $A/period_T$T --no-plots; done
      for c in 0 1e-3; do dm learn --config main-fast --effort $c --out $A/effort_c$c --no-plots; done ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac
done
