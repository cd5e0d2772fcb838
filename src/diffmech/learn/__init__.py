"""Structure-preserving learned dynamics: NODE, L-NODE, SyMo and E2E-SyMo (Santos et al., L4DC 2022).

Data from any :class:`~diffmech.RobotModel` (:mod:`.systems`, :mod:`.data`), the models
(:mod:`.models`, on the jet-carrying networks of :mod:`.networks`), training runs with checkpoints
(:mod:`.train`), the paper's metrics and corrected ones (:mod:`.metrics`), sweeps
(:mod:`.sweep`) and figures (:mod:`.figures`). The command line is ``diffmech symo ...``.
"""

from .data import (
    StepSamples,
    SymoDataset,
    Trajectories,
    gym_np_random,
    load_dataset,
    make_dataset,
    rk45_step_batched,
    simulate,
    step_samples,
)
from .metrics import one_step_losses, paper_integration_columns, paper_loss_columns, rollout_metrics
from .models import LNODE, MODEL_NAMES, NODE, E2ESyMo, LearnedDynamics, Prediction, Rollout, SyMo, build_model
from .networks import AngleEmbedding, LagrangianNet
from .systems import PRESETS, System, SystemPreset, get_system, system_from_robot
from .train import TrainConfig, load_run_model, run

__all__ = [
    "StepSamples", "SymoDataset", "Trajectories", "gym_np_random", "load_dataset", "make_dataset",
    "rk45_step_batched", "simulate", "step_samples",
    "one_step_losses", "paper_integration_columns", "paper_loss_columns", "rollout_metrics",
    "E2ESyMo", "LNODE", "MODEL_NAMES", "NODE", "LearnedDynamics", "Prediction", "Rollout", "SyMo", "build_model",
    "AngleEmbedding", "LagrangianNet",
    "PRESETS", "System", "SystemPreset", "get_system", "system_from_robot",
    "TrainConfig", "load_run_model", "run",
]
