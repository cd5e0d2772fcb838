"""A griffe extension for the API reference: diffmech's docstrings cross-reference with Sphinx roles
(``:class:`~diffmech.sim.Scene```, ``:func:`rollout```), which Markdown would show verbatim. Each
role becomes inline code of its target (the last component with a leading ``~``, as Sphinx shows it)."""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|obj|exc|const):`(~?)([^`]+)`")


def _plain(match: re.Match) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target.lstrip('.')}`"


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_plain, obj.docstring.value)
