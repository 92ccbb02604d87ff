"""H-MAS's ``Π_meta`` as a model's decision: the prompt it is asked, and its validated reply.

H-MAS (§3.4.1, Appendix C.2) lets an LLM read the long-horizon view ``V_long`` and emit
a strict JSON decision naming the active policy; the answer is validated against the
whitelist Ω (the pool) and "parsing failures fall back to local rules". This module is
the model's side of that loop, for :class:`~fairagents.policies.adaptive.Adaptive`
(``selector=``):

- :func:`decision_prompt` renders the prompt: the instruction, the whitelist with one
  line per policy, and the view as JSON;
- :func:`parse_decision` validates a reply into a :class:`Decision`, or ``None``.

:class:`~fairagents.runtime.selector.ModelSelector` asks a model of the pool through an arbiter.

What a reply must be: a JSON object ``{"policy": "<name>", "reason": "<short text>"}``,
alone or inside other text (a ```json fence, prose around it); the first JSON object in
the text that parses is the one read. ``policy`` must be a name of the whitelist
(``adaptive`` itself never is); ``reason`` is optional, a string of at most 200
characters. Other keys are ignored: the paper's decision may carry hints ``h_t`` and a
bypass signal ``ξ_bypass``, which are not acted on here (the bypass is decided by the
rules alone). Anything else is no decision (``None``), and the policy applies its rules.

Examples:
    >>> from fairagents.policies.decision import parse_decision
    >>> parse_decision('Sure: ```json\\n{"policy": "edf", "reason": "deadline misses"}\\n```', ["fcfs", "edf"])
    Decision(policy='edf', reason='deadline misses')
    >>> parse_decision('{"policy": "lottery"}', ["fcfs", "edf"]) is None
    True
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

__all__ = ["DESCRIPTIONS", "Decision", "decision_prompt", "parse_decision"]

#: One line per known policy, as the prompt describes it to the model.
DESCRIPTIONS: dict[str, str] = {
    "fcfs": "first come, first served (arrival order): the safe baseline under overload or anomalies",
    "edf": "earliest deadline first, from the SLOs and predicted lengths: when TTFT/TPOT deadlines are missed",
    "sjf": "shortest predicted job first, with aging: low latency for short requests under steady load",
    "two_lane": "fast and slow lanes by predicted service time: isolates long generations that block short "
                "ones (high output-length variance with TTFT misses)",
    "wfq": "weighted fair queueing by virtual finish time: when apps get unfair shares of service",
    "rr": "round robin, one dispatch per app in turn: simple bounded sharing between apps",
    "vtc": "virtual token counter per client: fair shares of raw tokens",
    "hmfs": "hierarchical weighted fair sharing (apps, then agents) in unified tokens",
    "hmfs_credit": "hierarchical weighted fair sharing, where an app back from idle keeps up to U of its lag: "
                   "for light apps whose bursts (fan-outs, runs arriving together) share the pool with backlogged ones",
    "hmfs_runs": "weighted fair sharing between apps; inside an app, workflow runs by least attained service, "
                 "a fan-out's calls together: for agent graphs whose runs fan out",
    "exfairs": "SLO-aware experiential fairness between apps (credit exchange, proportional insertion)",
    "duet": "arrival order, then predicted cost, with aging past the p90 wait",
}
_GENERIC = "a registered scheduling policy"
_REASON_MAX = 200
_MAX_OBJECTS = 64  # JSON objects tried in one reply, at most


class Decision(BaseModel):
    """A model's decision: the policy to make active, and why."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    policy: StrictStr
    reason: StrictStr | None = Field(default=None, max_length=_REASON_MAX)


def parse_decision(text: Any, whitelist: Collection[str]) -> Decision | None:
    """The decision in a model's reply ``text``, or ``None`` if it holds none valid for ``whitelist``.

    The first JSON object in ``text`` that parses is read (alone, fenced, or in prose);
    it must validate as a :class:`Decision` whose ``policy`` is in ``whitelist`` and is
    not ``adaptive``. Names are matched exactly.

    Examples:
        >>> from fairagents.policies.decision import parse_decision
        >>> parse_decision('I pick {"policy": "wfq"} because shares drift.', ("wfq",)).policy
        'wfq'
        >>> parse_decision("wfq", ("wfq",)) is None, parse_decision('{"policy": 3}', ("wfq",)) is None
        (True, True)
    """
    if not isinstance(text, str):
        return None
    found = _first_object(text)
    if found is None:
        return None
    try:
        decision = Decision.model_validate(found)
    except ValidationError:
        return None
    if decision.policy == "adaptive" or decision.policy not in whitelist:
        return None
    return decision


def _first_object(text: str) -> dict[str, Any] | None:
    """The first JSON object of ``text`` that parses (tried from each ``{`` in turn)."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    tries = 0
    while start != -1 and tries < _MAX_OBJECTS:
        tries += 1
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            pass
        else:
            if isinstance(value, dict):
                return value
        start = text.find("{", start + 1)
    return None


def decision_prompt(view: Mapping[str, Any]) -> str:
    """The prompt that asks a model for a decision on ``view`` (its ``pool`` is the whitelist).

    Examples:
        >>> from fairagents.policies.decision import decision_prompt
        >>> prompt = decision_prompt({"pool": ["fcfs", "edf"], "violation_rate": 0.25})
        >>> "- edf: earliest deadline first" in prompt and '"violation_rate": 0.25' in prompt
        True
    """
    pool: Sequence[str] = list(view.get("pool", ()))
    lines = [f"- {name}: {DESCRIPTIONS.get(name, _GENERIC)}" for name in pool]
    example = json.dumps({"policy": pool[0] if pool else "fcfs", "reason": "one short sentence"})
    return "\n".join([
        ("You are the meta controller of an LLM serving scheduler. Every interval you choose the scheduling "
         "policy that orders the waiting requests, from the workload statistics of the last interval."),
        "Choose exactly one policy name from this whitelist:",
        *lines,
        "",
        ("Statistics of the last interval (JSON; rates are per second, times in seconds; \"rules\" is what the "
         "deterministic rule map would choose):"),
        json.dumps(dict(view), indent=1, sort_keys=True, default=str),
        "",
        (f"Answer with only a JSON object, e.g. {example}: \"policy\" is one name of the whitelist, "
         f"\"reason\" at most {_REASON_MAX} characters."),
    ])
