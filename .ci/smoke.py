"""The installed wheel's smoke test (run by .ci/wheel from outside the source tree).

Checks that the package imports from site-packages (not from a checkout), that its C sources were
packaged, and that a contact rollout takes the native route (compiled from those sources) with a
gradient equal to the closed form.
"""

import os
import sys
import tempfile
from importlib import resources

os.environ["DIFFMECH_NATIVE"] = "require"  # a kernel that cannot be built is an error, not a fallback
os.environ["DIFFMECH_CACHE_DIR"] = tempfile.mkdtemp(prefix="diffmech-smoke-")

import torch  # noqa: E402

import diffmech  # noqa: E402
from diffmech.model import systems  # noqa: E402
from diffmech.sim import Scene, rollout  # noqa: E402

where = os.path.dirname(diffmech.__file__)
assert "site-packages" in where, f"diffmech imported from {where}, not from the installed wheel"
for rel in ("contact/pgs.c", "contact/update.c", "sim/ground_driver.c", "py.typed"):
    assert resources.files("diffmech").joinpath(rel).is_file(), f"{rel} is missing from the wheel"

# A sphere of radius 0.1 m thrown sideways at 0.5 m/s from 0.3 m: the contact is in the scene from the
# first step but the sphere reaches the ground only at t = 0.202 s, so after 0.2 s x = 0.5 t exactly.
dt, steps = 1e-3, 200
scene = Scene([systems.sphere(0.1, 1.0)])
q0 = torch.tensor([0.0, 0.0, 0.3, 0.0, 0.0, 0.0, 1.0], dtype=torch.float64)
v0 = torch.tensor([0.5, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64, requires_grad=True)
stats: dict = {}
q, v = rollout(scene, q0, v0, torch.zeros(steps, 6, dtype=torch.float64), dt, stats=stats)
q[-1, 0].backward()
assert stats["route"] == "native", stats["route"]
x = q[-1, 0].detach().item()
assert abs(x - 0.5 * steps * dt) < 1e-12, x
assert abs(float(v0.grad[0]) - steps * dt) < 1e-12, v0.grad
print(f"smoke: diffmech {diffmech.__version__} from {where}: native contact route, gradient exact", file=sys.stderr)
