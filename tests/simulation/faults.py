"""What the simulated world may do wrong, each with a switch, and the holes the engine has.

A run enables a set of :class:`Fault` kinds (:data:`DEFAULT`: what the current engine survives).
Each of :data:`KNOWN_HOLES` is a way the engine is known to break: left out of the default,
enabled by name (``make simulate FAULTS=+bogus_tick``) once its fix lands.
"""

from __future__ import annotations

from enum import Enum


class Fault(Enum):
    CRASH = "crash"  # a worker dies at a write boundary; its in-flight records delivered or lost
    RESTART_EMPTY = "restart_empty"  # a dead worker comes back on an empty data dir
    RESTART_OLD = "restart_old"  # ... or on the data dir it left
    REBALANCE = "rebalance"  # partitions move between live workers (revoke, settle, restore)
    COMPACTION = "compaction"  # the changelog is compacted up to a cut, leaving offset gaps
    TOMBSTONE_EXPIRY = "tombstone_expiry"  # compacted tombstones go after delete.retention.ms
    DUPLICATE_TICK = "duplicate_tick"  # an oscillator's tick comes again
    REORDERED_TICK = "reordered_tick"  # a tick of a past second comes after later ones
    LATE_TICK = "late_tick"  # an oscillator stops for seconds, then sends what it owes
    CLOCK_SKEW = "clock_skew"  # workers' and oscillators' clocks off by less than the tolerance
    SLOW_BROKER = "slow_broker"  # a worker's records take longer to land (within the settle time)
    COMMITTED_TXN = "committed_txn"  # requests written in committed transactions (markers)
    MALFORMED_REQUEST = "malformed_request"  # a valid Future with an unknown group field appended
    SWEEP_HANDBACK = "sweep_handback"  # a disk slow enough that a sweep outlasts a tick
    STALE_DIR_AFTER_EXPIRY = "stale_dir_after_expiry"  # a table found again after tombstones expired
    ABORTED_TXN = "aborted_txn"  # requests written in aborted transactions
    LATE_ZOMBIE_WRITES = "late_zombie_writes"  # a revoked step writes after settle_revoked gave up
    BOGUS_TICK = "bogus_tick"
    PAUSED_OWNER = "paused_owner"  # an owner stalled past its session fires on before it hears


#: The holes the engine is known to have, one line each. A run enables none of them unless asked.
KNOWN_HOLES: dict[Fault, str] = {}

#: What ``make test`` runs: every fault kind but the known holes.
DEFAULT: frozenset[Fault] = frozenset(f for f in Fault if f not in KNOWN_HOLES)


def parse(spec: str) -> frozenset[Fault]:
    """Fault kinds from ``spec``: ``default``, ``all``, or a comma list of names, each ``+name``
    (added to the default) or ``-name`` (taken from it) or ``name`` (only those named)."""
    spec = spec.strip()
    if spec in ("", "default"):
        return DEFAULT
    if spec == "all":
        return frozenset(Fault)
    names = [name.strip() for name in spec.split(",") if name.strip()]
    relative = all(name[0] in "+-" for name in names)
    chosen = set(DEFAULT) if relative else set()
    for name in names:
        sign, bare = (name[0], name[1:]) if name[0] in "+-" else ("+", name)
        try:
            fault = Fault(bare)
        except ValueError:
            raise ValueError(f"unknown fault {bare!r}: one of {', '.join(f.value for f in Fault)}") from None
        (chosen.add if sign == "+" else chosen.discard)(fault)
    return frozenset(chosen)
