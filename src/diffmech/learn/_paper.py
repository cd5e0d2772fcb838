"""The published numbers of the seed paper's Figures 3 (pendulum, h = 0.1) and 4 (cart-pole, h = 0.05).

Santos et al., "Symplectic Momentum Neural Networks", L4DC 2022: the plotted train, test,
integration, energy and inertia errors of each model at N = 8, 16, 32, 64, 128 training initial
conditions, to four significant digits, for overlays and comparison tables. The metric definitions
are those of :mod:`diffmech.learn.metrics` (paper-compatible keys).
"""

from __future__ import annotations

N_ICS = (8, 16, 32, 64, 128)
H = {"pendulum": 0.1, "cartpole": 0.05}

PAPER: dict[str, dict[str, dict[str, tuple]]] = {
    "pendulum": {
        "node-rk4": {
            "train_loss": (2.038e-08, 5.237e-08, 3.636e-08, 2.833e-08, 2.204e-08),
            "test_loss": (4.161e-06, 3.35e-07, 3.392e-08, 2.546e-08, 2.056e-08),
            "integration_loss": (591.2, 4.649, 64.55, 196.7, 106.2),
            "energy_loss": (5.639, 0.13, 0.1057, 0.1036, 0.02688),
            "inertia_loss": (None, None, None, None, None),
        },
        "node-midpoint": {
            "train_loss": (5.467e-05, 0.0001765, 0.0001383, 0.0001261, 0.0001289),
            "test_loss": (0.0001297, 0.0001301, 0.0001279, 0.000128, 0.0001282),
            "integration_loss": (5575, 2843, 2288, 2810, 3670),
            "energy_loss": (395.6, 41.08, 7.924, 10.25, 16.74),
            "inertia_loss": (None, None, None, None, None),
        },
        "lnode-rk4": {
            "train_loss": (6.671e-09, 5.225e-08, 5.171e-08, 5.576e-08, 2.566e-08),
            "test_loss": (2.459e-08, 3.305e-08, 3.505e-08, 5.889e-08, 2.08e-08),
            "integration_loss": (0.6, 0.5, 0.4982, 0.3929, 0.5272),
            "energy_loss": (0.001963, 0.001962, 0.001993, 0.00194, 0.00199),
            "inertia_loss": (7.248e-08, 1.062e-06, 6.358e-07, 5.145e-07, 3.464e-07),
        },
        "lnode-midpoint": {
            "train_loss": (5.603e-05, 0.0001802, 0.0001413, 0.000129, 0.0001319),
            "test_loss": (0.0001315, 0.0001313, 0.0001312, 0.0001312, 0.0001312),
            "integration_loss": (4786, 4804, 4802, 4810, 4808),
            "energy_loss": (37.93, 38.63, 38.62, 39.25, 39.14),
            "inertia_loss": (1.663e-05, 2.666e-05, 1.932e-05, 1.847e-05, 1.851e-05),
        },
        "symo": {
            "train_loss": (2.668e-08, 1.627e-07, 1.745e-07, 1.616e-07, 1.37e-07),
            "test_loss": (3.816e-07, 1.721e-07, 1.751e-07, 1.716e-07, 1.274e-07),
            "integration_loss": (0.02303, 0.09566, 0.003379, 0.009084, 0.02773),
            "energy_loss": (0.3778, 0.3787, 0.3782, 0.3787, 0.3791),
            "inertia_loss": (1.918e-05, 8.115e-06, 1.027e-05, 1.147e-05, 1.144e-05),
        },
        "e2e-symo": {
            "train_loss": (3.023e-08, 1.34e-07, 1.568e-07, 1.406e-07, 1.237e-07),
            "test_loss": (2.812e-07, 1.502e-07, 1.575e-07, 1.481e-07, 1.133e-07),
            "integration_loss": (0.02277, 0.03018, 0.003899, 0.02394, 0.028),
            "energy_loss": (0.3777, 0.3783, 0.3783, 0.3787, 0.379),
            "inertia_loss": (1.71e-05, 7.264e-06, 9.572e-06, 1.061e-05, 1.065e-05),
        },
    },
    "cartpole": {
        "node-rk4": {
            "train_loss": (8.357e-10, 5.584e-10, 1.681e-10, 3.218e-10, 2.831e-10),
            "test_loss": (7.566e-05, 1.147e-05, 1.743e-06, 4.181e-07, 1.874e-07),
            "integration_loss": (307.5, 75, 46.36, 9.885, 0.5358),
            "energy_loss": (0.1851, 2.302, 6.008, 0.01571, 0.002406),
            "inertia_loss": (None, None, None, None, None),
        },
        "node-midpoint": {
            "train_loss": (3.805e-07, 3.477e-07, 3.97e-07, 4.108e-07, 4.133e-07),
            "test_loss": (7.214e-05, 1.214e-05, 2.085e-06, 6.858e-07, 4.537e-07),
            "integration_loss": (355.8, 80.05, 99.5, 19.75, 0.9598),
            "energy_loss": (0.1448, 3.763, 3.448, 0.01419, 0.00192),
            "inertia_loss": (None, None, None, None, None),
        },
        "lnode-rk4": {
            "train_loss": (6.448e-05, 0.0003284, 1.786e-06, 2.627e-07, 2.524e-07),
            "test_loss": (0.001014, 0.0008523, 3.158e-05, 2.203e-06, 4.765e-07),
            "integration_loss": (14.07, 19.76, 0.1785, 0.0829, 0.1138),
            "energy_loss": (0.4714, 1.265, 2.103e-06, 1.23e-06, 1.437e-06),
            "inertia_loss": (0.02768, 0.04589, 3.262e-05, 4.793e-06, 1.07e-05),
        },
        "lnode-midpoint": {
            "train_loss": (7.018e-05, 0.0004693, 1.586e-06, 5.897e-07, 5.083e-07),
            "test_loss": (0.0009761, 0.001122, 1.878e-05, 3.113e-06, 7.676e-07),
            "integration_loss": (12.55, 88.2, 1.734, 2.272, 2.395),
            "energy_loss": (0.4466, 1.67, 0.0003895, 0.0004032, 0.0004067),
            "inertia_loss": (0.02875, 0.8874, 0.0001399, 0.0001278, 0.0001365),
        },
        "symo": {
            "train_loss": (1.584e-07, 7.429e-08, 1.02e-07, 7.264e-08, 1.076e-07),
            "test_loss": (2.291e-06, 4.015e-07, 4.253e-07, 1.641e-07, 1.56e-07),
            "integration_loss": (1.545, 0.3938, 0.2758, 0.229, 0.1794),
            "energy_loss": (0.001828, 0.0006468, 0.000617, 0.0006419, 0.0006294),
            "inertia_loss": (0.00149, 5.982e-05, 5.383e-05, 4.393e-05, 4.692e-05),
        },
        "e2e-symo": {
            "train_loss": (2.613e-07, 3.967e-09, 3.28e-09, 3.455e-09, 4.448e-09),
            "test_loss": (5.102e-06, 2.831e-07, 4.642e-08, 2.373e-08, 7.114e-09),
            "integration_loss": (17.93, 0.1427, 0.0869, 0.09069, 0.1025),
            "energy_loss": (0.9106, 0.0006068, 0.0006054, 0.0006042, 0.0006047),
            "inertia_loss": (0.024, 2.882e-05, 1.941e-05, 4.828e-06, 7.064e-06),
        },
    },
}
