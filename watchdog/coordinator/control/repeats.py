"""The restart-loop breaker: a failure that comes back after a restart is
escalated instead of spending the restart budget on it again.

Policy file (every key optional; the defaults shown; parsed in policy_file.py)::

    [repeats]
    same_host = "exclude_host_restart"   # the culprit's host failed the same way before
    same_place = "abort"                 # the same place in the code failed before, on other hosts
    after = 1                            # earlier occurrences that make it a repeat (1: escalate the 2nd)

``"off"`` disables a rule. Rules apply only when the policy already chose a
restarting action for the finding (destructive actions stay opt-in), and are
checked in this order:

1. same place, culprits on *other* hosts: deterministic (code, data, config);
   ``same_place`` (abort: "deterministic: the same failure at the same place
   after N restarts").
2. same host: the host is the common factor; ``same_host`` (exclude it).
3. same place on the same host, when ``same_host`` is off, the job has one
   host or the culprits are on every host (excluding them would end the job:
   the host cannot be told from the code there): ``same_place``. A one-host
   job's repeat elsewhere in the code is no repeat: it restarts as usual,
   within the budget. A straggler's place is its culprit rank(s)
   (fingerprint.CULPRIT_IS_PLACE).

The history is the fingerprints of the findings restarts were spent on
(``JobControl.history``); see control/fingerprint.py for what is compared when.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..policy_file import OFF, Repeats
from .fingerprint import Fingerprint, same_host, same_place


@dataclass(frozen=True)
class Escalation:
    action: str
    rule: str  # "same_place" / "same_host"
    reason: str
    matches: tuple[Fingerprint, ...]  # the earlier occurrences

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "rule": self.rule,
            "reason": self.reason,
            "occurrences": len(self.matches) + 1,
            "earlier": [m.to_dict() for m in self.matches],
        }


def escalate(
    fp: Fingerprint, history: Sequence[Fingerprint], rules: Repeats, hosts_in_job: int = 0
) -> Escalation | None:
    """The escalation this fingerprint earns given the earlier ones, or None. Pure.
    ``hosts_in_job``: hosts the job runs on (0 = unknown)."""
    # Excluding the culprits' hosts is no remedy when they are all the job's hosts (one
    # host, or a job-wide event such as ranks that all froze together): the place decides.
    no_exclusion = hosts_in_job == 1 or every_host(fp.hosts, hosts_in_job)
    place = [p for p in history if same_place(p, fp)]
    elsewhere = [p for p in place if not set(p.hosts) & set(fp.hosts)]
    host = [p for p in history if same_host(p, fp)]
    if rules.same_place != OFF and len(elsewhere) >= rules.after:
        return _deterministic(fp, elsewhere, rules.same_place)
    if rules.same_host != OFF and not no_exclusion and len(host) >= rules.after:
        hosts = sorted(set(fp.hosts) & {h for p in host for h in p.hosts})
        return Escalation(
            rules.same_host,
            "same_host",
            f"repeat on the same host: {fp.kind} on {', '.join(hosts)} "
            f"again after {len(host)} restart(s) for it; the host is the common factor",
            tuple(host),
        )
    if rules.same_place != OFF and (rules.same_host == OFF or no_exclusion) and len(place) >= rules.after:
        return _deterministic(fp, place, rules.same_place)
    return None


def every_host(hosts: Sequence[str], hosts_in_job: int) -> bool:
    """``hosts`` are every host the job runs on (``hosts_in_job``; 0 = unknown)."""
    return hosts_in_job > 0 and len(set(hosts)) >= hosts_in_job


def _deterministic(fp: Fingerprint, matches: list[Fingerprint], action: str) -> Escalation:
    hosts = sorted({h for p in (*matches, fp) for h in p.hosts})
    where = f" (hosts {', '.join(hosts)})" if hosts else ""
    return Escalation(
        action,
        "same_place",
        f"deterministic: the same failure at the same place after "
        f"{len(matches)} restart(s): {' '.join((fp.kind, fp.place())).strip()}{where}",
        tuple(matches),
    )
