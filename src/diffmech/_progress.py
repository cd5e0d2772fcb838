"""Progress of long calls (rollouts, training, stabilisation): a tqdm bar on a terminal, log lines elsewhere.

Every long Python call of diffmech takes ``progress: bool | None`` and reports through one
:class:`Stage` per stage of its work (a rollout's forward pass, its backward pass, a training loop):

* ``progress=None`` (the default): nothing while the stage is short. Once it has run
  :data:`AFTER_S` seconds (checked at each step it reports, and when it ends) it shows itself: on a
  terminal (``sys.stderr.isatty()``) as a tqdm bar on stderr, elsewhere as one INFO line of the
  ``diffmech.<module>`` logger when it is noticed (what it does, with its sizes) and one when it ends
  (elapsed seconds). The lines go to stderr through :func:`diffmech._log.show` unless the user
  configured logging; ``logging.getLogger("diffmech").setLevel(logging.WARNING)`` silences them.
* ``progress=True``: a bar from the first step, terminal or not.
* ``progress=False``: nothing.

A short stage costs one attribute test and one clock reading per reported step, 0.2 to 0.4 us: less
than 0.1 % of a small robot's simulation step (docs/logging.md, "What it costs").
"""

from __future__ import annotations

import sys
import time
from logging import Logger

from . import _log

# seconds after which a stage of a call with progress=None shows itself; tests lower it
AFTER_S = 2.0


def _on_terminal() -> bool:
    try:
        return bool(sys.stderr is not None and sys.stderr.isatty())
    except (AttributeError, ValueError):  # a replaced or closed stderr
        return False


class Stage:
    """One stage of long work: ``update(n)`` after each ``n`` units, :meth:`close` (or ``with``) at the end.

    Args:
        log: the module's logger (``diffmech._log.get(name)``).
        what: what the stage does, as in ``"rollout"`` or ``"symo train pendulum/symo"``: the bar's
            label and the start of each log line.
        total: units of the whole stage (``None``: unknown).
        sizes: the sizes of the work, for the first log line (``"500 steps x batch 64, nv 7"``).
        progress: ``None`` (after :data:`AFTER_S` seconds: a bar on a terminal, log lines
            elsewhere), ``True`` (a bar at once) or ``False`` (nothing).
        unit: the unit counted, for the bar and the lines.
        initial: units already done (a resumed run).
    """

    __slots__ = ("log", "what", "total", "sizes", "unit", "n", "t0", "deadline", "bar", "logged", "postfix", "force")

    def __init__(self, log: Logger, what: str, total: int | None = None, *, sizes: str = "",
                 progress: bool | None = None, unit: str = "step", initial: int = 0):
        self.log, self.what, self.total, self.sizes, self.unit = log, what, total, sizes, unit
        self.n = initial
        self.t0 = time.perf_counter()
        self.bar = None
        self.logged = False
        self.postfix: dict = {}
        self.force = progress is True
        # update() reads the clock only while this is finite: not once shown, never with progress=False
        self.deadline = float("inf") if progress is False else self.t0 + AFTER_S
        if self.force:
            self._show()

    # the hot path: one comparison and one clock reading per call while the stage is short
    def update(self, n: int = 1) -> None:
        self.n += n
        if self.bar is not None:
            self.bar.update(n)
        elif time.perf_counter() >= self.deadline:
            self._show()

    def set_postfix(self, **values) -> None:
        """Values shown after the bar, and in the last log line."""
        self.postfix = values
        if self.bar is not None:
            self.bar.set_postfix(values, refresh=False)

    def _show(self) -> None:
        self.deadline = float("inf")
        if self.force or _on_terminal():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, initial=self.n, desc=self.what, unit=self.unit, leave=False,
                            file=sys.stderr, dynamic_ncols=True)
            if self.postfix:
                self.bar.set_postfix(self.postfix, refresh=False)
            return
        _log.show()
        self.logged = True
        done = f"{self.n} of {self.total}" if self.total is not None else f"{self.n}"
        self.log.info("%s: %s%s(%s %ss after %.1f s)", self.what, self.sizes, " " if self.sizes else "", done,
                      self.unit, time.perf_counter() - self.t0)

    @property
    def elapsed(self) -> float:
        """Seconds since the stage started."""
        return time.perf_counter() - self.t0

    def close(self, failed: BaseException | None = None) -> None:
        """End the stage: close the bar, or log the elapsed time if the stage was logged or ran long."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
            return
        elapsed = self.elapsed
        if not self.logged and not (self.deadline != float("inf") and time.perf_counter() >= self.deadline):
            return  # short (or progress=False): nothing was shown, nothing to end
        if not self.logged:
            # a stage without steps in between (or whose last step ran long): its only line says all
            # (on a terminal too: a bar cannot be drawn after the fact)
            _log.show()
            head = f"{self.sizes}, " if self.sizes else ""
        else:
            head = ""
        self.logged = False
        # the units done (none for a stage that reports no steps) and the last values of the bar
        done = [f"{self.n} {self.unit}s"] if self.total is not None or self.n else []
        done += [f"{k}={v}" for k, v in self.postfix.items()]
        tail = f" ({', '.join(done)})" if done else ""
        if failed is not None:
            self.log.info("%s: %sstopped after %.1f s by %s%s", self.what, head, elapsed, type(failed).__name__, tail)
        else:
            self.log.info("%s: %sdone in %.1f s%s", self.what, head, elapsed, tail)

    def __enter__(self) -> Stage:
        return self

    def __exit__(self, typ, exc, tb) -> None:
        self.close(exc)
