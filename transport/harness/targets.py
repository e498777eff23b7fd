"""Which agents of a local cluster each `TARGET=KIND[:RATE][@PEER]` fault reaches, or why it reaches none.

A target names every agent (""), a role (`decode`), an instance (`prefill-1`) or one rank
(`prefill-1/TP0`); a fault's `@PEER` names agents of the other role the same way. A target or
peer that names no agent, or a fault that no targeted rank can act on (`ROLE_KINDS`), is a
`ConfigError` that says what the cluster has. A fault given to both roles (target "" or a peer
filter that only one side can match) goes to the ranks that can act on it.
"""

from __future__ import annotations

from collections.abc import Iterable

from transport.config import Role
from transport.errors import ConfigError
from transport.kv.faults import ROLE_KINDS, FaultSpec

Agent = tuple[Role, str]
"""(role, label), e.g. (Role.DECODE, "decode-1/TP0")."""


def names(role: Role, label: str) -> tuple[str, ...]:
    """Every name a target may give this agent: all agents, its role, its instance, its label."""
    return ("", role.value, label.partition("/")[0], label)


def plan_faults(agents: list[Agent], faults: dict[str, tuple[FaultSpec, ...]]) -> dict[str, tuple[FaultSpec, ...]]:
    """The faults each agent label gets; raises `ConfigError` naming what exists when one reaches nobody."""
    plan: dict[str, list[FaultSpec]] = {label: [] for _, label in agents}
    for target, specs in faults.items():
        targeted = [(role, label) for role, label in agents if target in names(role, label)]
        if not targeted:
            raise ConfigError(f"fault target {target!r} matches no agent; {describe(agents)}")
        for spec in specs:
            for role, label in _takers(target, spec, targeted, agents):
                other = Role.DECODE if role is Role.PREFILL else Role.PREFILL
                plan[label].append(FaultSpec(spec.kind, spec.rate, "") if spec.peer == other.value else spec)
    return {label: tuple(specs) for label, specs in plan.items() if specs}


def _takers(target: str, spec: FaultSpec, targeted: list[Agent], agents: list[Agent]) -> list[Agent]:
    where = repr(target) if target else "any agent"
    able = [(role, label) for role, label in targeted if spec.kind in ROLE_KINDS[role]]
    if not able:
        role = targeted[0][0]
        kinds = ", ".join(sorted(ROLE_KINDS[role]))
        raise ConfigError(
            f"fault {spec} cannot act on {where}: a {role} rank acts only on {kinds} (the others act on the sender)"
        )
    if spec.peer:
        able = [(role, label) for role, label in able if any(spec.peer in names(*a) for a in agents if a[0] != role)]
        if not able:
            raise ConfigError(
                f"fault {spec} on {where}: peer {spec.peer!r} matches no agent on the other side; {describe(agents)}"
            )
    return able


def describe(agents: Iterable[Agent]) -> str:
    """What a target can name in this cluster, in one line."""
    ranks: dict[str, list[str]] = {}
    for _, label in agents:
        instance, _, rank = label.partition("/")
        ranks.setdefault(instance, []).append(rank)
    groups: dict[tuple[str, ...], list[str]] = {}
    for instance, tps in ranks.items():
        groups.setdefault(tuple(tps), []).append(instance)
    parts = [f"{', '.join(instances)} (ranks {', '.join(tps)})" for tps, instances in groups.items()]
    return (
        f"this cluster has {'; '.join(parts)}; a target is a role (prefill, decode), an instance, "
        "a rank such as prefill-0/TP1, or nothing for every agent"
    )
