"""An interrupted eigenmode run resumed from its checkpoint is the uninterrupted run, bit for bit
(issue 35, item 6): the Newton warm start (the flow cache) is part of the checkpoint."""

from __future__ import annotations

import torch

from diffmech.control.configs import get_config
from diffmech.control.eigenmodes import EigenmodeTrainer

EPOCHS = 6
TIMING = {"train_seconds"}  # wall-clock, differs between any two runs


class _Interrupt(Exception):
    pass


def _history(tr):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in tr.history]


def test_resume_is_the_uninterrupted_run(tmp_path):
    torch.set_num_threads(1)
    cfg = get_config("tiny", epochs=EPOCHS)
    full = EigenmodeTrainer(cfg, str(tmp_path / "full"))
    full.train(progress=False)

    def interrupt(trainer, rec):
        if rec["epoch"] == EPOCHS // 2:  # killed in the first step after the checkpoint of epoch N/2
            raise _Interrupt

    cut = EigenmodeTrainer(cfg, str(tmp_path / "cut"))
    try:
        cut.train(progress=False, callback=interrupt, checkpoint_every=0.0)
    except _Interrupt:
        pass
    resumed = EigenmodeTrainer.load(str(tmp_path / "cut"))
    assert resumed.epoch == EPOCHS // 2
    resumed.train(progress=False)

    assert len(resumed.history) == len(full.history)
    assert _history(resumed) == _history(full)
    a, b = full.system.potential.state_dict(), resumed.system.potential.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(full.period, resumed.period)
    assert [s.get("iterations") for s in full.cache.stats] == [s.get("iterations") for s in resumed.cache.stats]
