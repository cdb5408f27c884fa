"""The role-floor rule the rolling plan applies — the router's rule, from the router's own numbers.

The router refuses a drain (409) that would leave a role with fewer placement-eligible engines able
to serve it than its floor (``controller.min_prefill`` / ``min_decode``; ``Scheduler.floor_breach``).
An engine can serve a role when it is labelled for it or unpinned (vLLM roles are router-side
labels). The workflows may not import the router (the HTTP API is the only door), so they apply the
same rule to what the router reports: roles (``/narwhal/handoff``), pins and floors
(``/narwhal/state``), eligibility (``accepts_new`` in ``/narwhal/lifecycle``).
``tests/unit/restart/test_floors.py`` runs this function and the router's over every small fleet and
requires the same verdicts. Pure: imported by workflow code.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

ROLES: tuple[str, ...] = ("prefill", "decode")


class Breach(NamedTuple):
    role: str
    remaining: int  # placement-eligible engines left able to serve the role
    floor: int


def can_serve(iid: str, role: str, roles: Mapping[str, str], pins: Mapping[str, bool]) -> bool:
    """Labelled for ``role``, or unpinned (a missing pin counts as pinned: the strict reading)."""
    return roles.get(iid) == role or not pins.get(iid, True)


def floor_breach(
    roles: Mapping[str, str],
    pins: Mapping[str, bool],
    eligible: Iterable[str],
    floors: Mapping[str, int],
    without: Iterable[str],
) -> Breach | None:
    """The role that taking ``without`` out of placement would leave below its floor, if any; only
    roles one of ``without`` can serve are checked (as the router does)."""
    gone = set(without)
    leaving = [i for i in sorted(gone) if i in roles]
    if not leaving:
        return None
    rest = [i for i in eligible if i not in gone]
    for role in ROLES:
        floor = floors.get(role, 0)
        if floor <= 0 or not any(can_serve(i, role, roles, pins) for i in leaving):
            continue
        remaining = sum(1 for i in rest if can_serve(i, role, roles, pins))
        if remaining < floor:
            return Breach(role, remaining, floor)
    return None
