"""Pure (plus reading two files): approval policies in Cedar, and what they decide about one proposed write.

A deployment's policy set is a Cedar policy file and its Cedar schema (docs/POLICIES.md). toolloop's
vocabulary, which the schema declares:

- `User in [Role] { tenant: String }`: a person, by id "tenant/user"; `Role`: a role by name ("manager"),
  which holds in the requester's tenant only.
- `Approval`: how a write may be approved: `Approval::"rule"` (at once, by the rule, with no person),
  `Approval::"person"` (the principal may decide it), `Approval::"second_person"` (a second, distinct person
  must approve too: four eyes).
- One action per write tool, named as the tool, whose context is `{ tenant, requester, arguments, facts }`:
  the exact arguments the digest binds and the facts the request read earlier (ToolSpec.policy_facts).

What a proposed write gets (evaluate):
- `deny` when a `forbid` matches its rule evaluation, when no rule lets anyone decide it, when the policy does
  not know the tool, or when the evaluation errs (fail closed: a forbid that could not be evaluated might
  have matched);
- `allow` when a `permit` on `Approval::"rule"` matches (and no forbid);
- `ask` otherwise: the requester may decide if a permit on `Approval::"person"` matches the requester, a role
  if one matches `Role::"<role>"` (the roles named in policies' principal scopes), and two people must
  approve if a permit on `Approval::"second_person"` matches.

A policy set that does not parse or does not validate against its schema refuses to load (PolicyError, one
line naming the policy and the error), so nothing falls open. Its version is the sha256 of the two files.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import cedarpy
from pydantic import BaseModel, ConfigDict, Field

from toolloop._core.approvals import Deciders

logger = logging.getLogger("toolloop.policy")

Verdict = Literal["allow", "deny", "ask"]

RULE = "rule"
PERSON = "person"
SECOND_PERSON = "second_person"


class PolicyError(ValueError):
    """A policy set that cannot be used (one line for the operator)."""


class PolicyVerdict(BaseModel):
    """What the policy decided about one proposed write, and by which rules."""

    model_config = ConfigDict(frozen=True)

    verdict: Verdict
    # The rules (policy ids: an @id annotation, else Cedar's own) that decided: the permits that allowed it,
    # the forbids that denied it, or the permits that let people decide it.
    rules: list[str] = Field(default_factory=list)
    version: str
    deciders: Deciders | None = None  # for "ask"
    reason: str = ""  # for "deny", in one sentence


@dataclass(frozen=True)
class WriteProposal:
    """One proposed write as a policy sees it."""

    tool: str
    tenant_id: str
    user_id: str
    roles: tuple[str, ...]
    arguments: Mapping[str, Any]
    facts: Mapping[str, Any]


class Policies:
    """A loaded, validated policy set. Build it with load_policies."""

    def __init__(self, text: str, schema: str, source: str) -> None:
        self.source = source
        self.version = "sha256:" + hashlib.sha256((text + "\0" + schema).encode("utf-8")).hexdigest()[:32]
        try:
            parsed = json.loads(cedarpy.policies_to_json_str(text))
        except ValueError as exc:
            raise PolicyError(f"{source}: the policy does not parse: {_first_line(exc)}") from None
        try:
            parse_schema = cedarpy.Schema.from_json_str if schema.lstrip().startswith("{") else cedarpy.Schema.from_str
            self._schema = parse_schema(schema)
        except ValueError as exc:
            raise PolicyError(f"{source}: its schema does not parse: {_first_line(exc)}") from None
        result = cedarpy.validate_policies(text, self._schema)
        if not result.validation_passed:
            error = result.errors[0]
            raise PolicyError(f"{source}: policy {self._name(parsed, error.policy_id)}: {error.error}")
        self._text = cedarpy.PolicySet.from_str(text)
        static: dict[str, Any] = parsed.get("staticPolicies", {})
        self.rule_names = {pid: self._name(parsed, pid) for pid in static}
        self.roles = sorted(
            {
                p["principal"]["entity"]["id"]
                for p in static.values()
                if p["principal"].get("op") in ("in", "==") and p["principal"].get("entity", {}).get("type") == "Role"
            }
        )

    @staticmethod
    def _name(parsed: dict[str, Any], policy_id: str) -> str:
        annotations = parsed.get("staticPolicies", {}).get(policy_id, {}).get("annotations") or {}
        return str(annotations.get("id") or policy_id)

    def _ask(self, principal: dict[str, str], resource: str, proposal: WriteProposal) -> Any:
        requester = {"type": "User", "id": _user_id(proposal)}
        entities: list[dict[str, Any]] = [
            {"uid": requester, "attrs": {"tenant": proposal.tenant_id}, "parents": _roles(proposal.roles)},
            *({"uid": role, "attrs": {}, "parents": []} for role in _roles(self.roles)),
        ]
        context = {
            "tenant": proposal.tenant_id,
            "requester": {"__entity": requester},
            "arguments": _cedar_value(proposal.arguments),
            "facts": _cedar_value(proposal.facts),
        }
        request = {
            "principal": principal,
            "action": {"type": "Action", "id": proposal.tool},
            "resource": {"type": "Approval", "id": resource},
            "context": context,
        }
        answer = cedarpy.is_authorized(request, self._text, entities, schema=self._schema)
        if answer.diagnostics.errors:
            raise _EvaluationFailed(
                f"the policy could not be evaluated for {proposal.tool}: {_first_line(answer.diagnostics.errors[0])}"
            )
        return answer

    def evaluate(self, proposal: WriteProposal) -> PolicyVerdict:
        """What this policy set decides about `proposal` (the module's docstring says how)."""
        try:
            return self._evaluate(proposal)
        except _EvaluationFailed as failed:
            # Fail closed: a forbid that could not be evaluated might have matched.
            return self._deny([], str(failed))

    def _evaluate(self, proposal: WriteProposal) -> PolicyVerdict:
        requester = {"type": "User", "id": _user_id(proposal)}
        rule = self._ask(requester, RULE, proposal)
        if rule.allowed:
            return PolicyVerdict(verdict="allow", rules=self._names(rule), version=self.version)
        if rule.diagnostics.reasons:  # a forbid matched: it always wins
            return self._deny(self._names(rule), "a rule forbids it")
        asked: list[str] = []
        requester_decides = False
        roles: list[str] = []
        for principal, role in [(requester, None), *(({"type": "Role", "id": r}, r) for r in self.roles)]:
            answer = self._ask(principal, PERSON, proposal)
            if answer.allowed:
                asked += [name for name in self._names(answer) if name not in asked]
                if role is None:
                    requester_decides = True
                else:
                    roles.append(role)
        if not requester_decides and not roles:
            return self._deny([], "no rule lets anyone decide it")
        second = self._ask(requester, SECOND_PERSON, proposal)
        if second.allowed:
            asked += [name for name in self._names(second) if name not in asked]
            if not roles:
                # Two distinct people, of whom only the requester may be one: nobody could ever approve it.
                return self._deny(asked, "it needs two people, and only the requester may decide it")
        deciders = Deciders(requester=requester_decides, roles=roles, approvals=2 if second.allowed else 1)
        return PolicyVerdict(verdict="ask", rules=asked, version=self.version, deciders=deciders)

    def _names(self, answer: Any) -> list[str]:
        return [self.rule_names.get(pid, pid) for pid in answer.diagnostics.reasons]

    def _deny(self, rules: list[str], reason: str) -> PolicyVerdict:
        return PolicyVerdict(verdict="deny", rules=rules, version=self.version, reason=reason)


def policy_rule_ids(policy_file: str | Path) -> frozenset[str]:
    """The rules (their @id, else Cedar's own id) of the policy in `policy_file`: what a service that checks
    policy decisions knows as rules (IdempotencyKit(policy_rules=...)). Raises PolicyError (one line)."""
    path = Path(policy_file)
    try:
        parsed = json.loads(cedarpy.policies_to_json_str(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"{path}: cannot be read ({exc.__class__.__name__})") from None
    except ValueError as exc:
        raise PolicyError(f"{path}: the policy does not parse: {_first_line(exc)}") from None
    return frozenset(Policies._name(parsed, pid) for pid in parsed.get("staticPolicies", {}))


class PolicyRuleIds:
    """The rule ids of a policy file as it is now: read again when the file changed (a service that checks
    policy decisions knows a new rule as soon as its file has it). A file that no longer parses keeps the ids
    it last had, and says so in the log."""

    def __init__(self, policy_file: str | Path) -> None:
        self.policy_file = Path(policy_file)
        self._seen = self._stat()
        self._ids = policy_rule_ids(self.policy_file)

    def _stat(self) -> tuple[int, int]:
        stat = self.policy_file.stat()
        return stat.st_mtime_ns, stat.st_size

    def __call__(self) -> frozenset[str]:
        try:
            seen = self._stat()
            if seen != self._seen:
                self._ids = policy_rule_ids(self.policy_file)
                self._seen = seen
        except (OSError, PolicyError) as exc:
            logger.error("the policy file cannot be read again; its last rule ids are kept", extra={"why": str(exc)})
        return self._ids


def load_policies(policy_file: str | Path, schema_file: str | Path) -> Policies:
    """The policy set in `policy_file` (Cedar) checked against `schema_file` (a Cedar schema, in Cedar's
    schema syntax or its JSON form). Raises PolicyError (one line) if it cannot be read, parsed or validated."""
    texts = []
    for path in (Path(policy_file), Path(schema_file)):
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise PolicyError(f"{path}: cannot be read ({exc.__class__.__name__})") from None
    return Policies(texts[0], texts[1], str(policy_file))


def _user_id(proposal: WriteProposal) -> str:
    return f"{proposal.tenant_id}/{proposal.user_id}"


def _roles(roles: tuple[str, ...] | list[str]) -> list[dict[str, str]]:
    return [{"type": "Role", "id": role} for role in roles]


def _cedar_value(value: Any) -> Any:
    """A JSON value as Cedar's JSON reads it: absent (None) attributes left out, lists as sets."""
    if isinstance(value, Mapping):
        return {str(k): _cedar_value(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_cedar_value(v) for v in value]
    return value


class _EvaluationFailed(Exception):
    """Cedar reported an error while evaluating a request (one line)."""


def _first_line(error: object) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else error.__class__.__name__
