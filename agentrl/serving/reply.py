"""What a chat reply of `agentrl serve` must be: ``tool_choice``, ``parallel_tool_calls`` and
``response_format``, and the assistant message built from the reply's text.

Owns: validating those fields (an :class:`~agentrl.serving.errors.APIError` naming the field),
resolving them to a :class:`ReplyPlan` — the tools the chat template is shown, whether
``<tool_call>`` blocks are parsed, text forced at the start of the reply, the check a finished
reply must pass — and :func:`build_message`: content, tool calls with unique ``call_<random>`` ids
and ``finish_reason`` ("tool_calls" when the reply calls tools).

How each mode is honoured. The local engine samples freely (no grammar-constrained decoding), so
the modes that restrict the reply are **prefix-constrained and re-sampled**: the start of the reply
is forced by appending it to the prompt, the finished reply is checked, and a reply that fails the
check is sampled again, up to :data:`MAX_ATTEMPTS` times (once for greedy requests: the same prompt
would give the same reply). When no attempt passes, the request fails with HTTP 422 naming the
field; a reply that breaks the request's contract is never returned.

- ``tool_choice="auto"`` (the default with tools): tools rendered, ``<tool_call>`` blocks parsed.
- ``"none"``: tools are not rendered and nothing is parsed: the reply is text.
- ``"required"``: the reply starts with ``<tool_call>``; it must hold at least one well-formed call
  of an offered tool.
- ``{"type": "function", "function": {"name": N}}``: the reply starts with
  ``<tool_call>\\n{"name": "N", "arguments": ``; every call must be a well-formed call of ``N``.
- ``parallel_tool_calls=false``: a reply with several calls fails the check (re-sampled).
- ``response_format={"type": "json_object"}``: text content must be a JSON object (forced to start
  with ``{`` when the reply cannot be a tool call); ``"json_schema"``: it must also validate against
  ``json_schema.schema`` (an invalid schema is a 400). A reply that calls tools is not held to it.

Does not: run the engine or speak HTTP (:mod:`agentrl.serving.api`, :mod:`agentrl.serving.app`).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from agentrl.serving.errors import APIError
from agentrl.tools.calls import OPEN, parse_hermes

#: samples of one choice before a constrained request (tool_choice, response_format) fails with 422
MAX_ATTEMPTS = 3


def call_id() -> str:
    """A fresh tool-call id, unique across turns and requests (``call_`` + 24 hex digits)."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ReplyPlan:
    """What one chat request's reply must be (see the module docstring)."""

    tools: list[dict] | None = None  # rendered into the prompt
    parse_tools: bool = False
    prefix: str = ""  # forced at the start of the reply
    require_call: str | None = None  # None, "*" (any offered tool) or a tool name
    offered: frozenset[str] = frozenset()
    single_call: bool = False
    json: str | None = None  # None, "json_object" or "json_schema"
    validator: Any = None  # a jsonschema validator for json_schema
    checked: list[str] = field(default_factory=list)  # the fields whose contract is checked

    @property
    def constrained(self) -> bool:
        """True when a finished reply is checked (and re-sampled): it cannot be streamed as sampled."""
        return bool(self.checked)


def _tool_names(tools: list[dict]) -> list[str]:
    names = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not (
            isinstance(t, dict)
            and t.get("type", "function") == "function"
            and isinstance(fn, dict)
            and isinstance(fn.get("name"), str)
            and fn["name"]
        ):
            raise APIError(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}, "
                f"got {t!r:.200}",
                param="tools",
            )
        names.append(fn["name"])
    return names


def _json_plan(plan: ReplyPlan, fmt: Any) -> None:
    if fmt is None:
        return
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return
    if kind not in ("json_object", "json_schema"):
        raise APIError(
            f"response_format must be {{'type': 'text' | 'json_object' | 'json_schema', ...}}, got {fmt!r:.200}",
            param="response_format",
        )
    plan.json = kind
    plan.checked.append("response_format")
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise APIError(
                f"response_format.json_schema.schema must be a JSON schema object, got {spec!r:.200}",
                param="response_format",
            )
        import jsonschema
        import jsonschema.validators  # a submodule: named for the type checker (jsonschema imports it itself)

        cls = jsonschema.validators.validator_for(schema)
        try:
            cls.check_schema(schema)
        except jsonschema.SchemaError as e:
            raise APIError(
                f"response_format.json_schema.schema is not a valid JSON schema: {e.message}", param="response_format"
            ) from None
        plan.validator = cls(schema)
    if not plan.parse_tools:
        plan.prefix = "{"


def plan_reply(body: dict) -> ReplyPlan:
    """Validate ``tools``, ``tool_choice``, ``parallel_tool_calls``, ``response_format`` -> the plan."""
    for legacy in ("functions", "function_call"):
        if body.get(legacy) is not None:
            raise APIError(
                f"{legacy} (the deprecated function-calling API) is not supported; use tools and tool_choice",
                param=legacy,
            )
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise APIError(f"tools must be a list, got {tools!r:.200}", param="tools")
    names = _tool_names(tools or [])
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise APIError(f"parallel_tool_calls must be a boolean, got {parallel!r}", param="parallel_tool_calls")
    plan = ReplyPlan(offered=frozenset(names), single_call=parallel is False)
    if choice is None or choice == "auto":
        plan.tools, plan.parse_tools = (tools or None), bool(names)
    elif choice == "none":
        pass  # no tools shown, nothing parsed
    elif choice == "required" or isinstance(choice, dict):
        if not names:
            raise APIError(f"tool_choice={choice!r} needs tools, and the request declares none", param="tool_choice")
        name = "*"
        if isinstance(choice, dict):
            fn = choice.get("function")
            name = fn.get("name") if isinstance(fn, dict) else None
            if choice.get("type") != "function" or not isinstance(name, str):
                raise APIError(
                    f"tool_choice must be 'auto', 'none', 'required' or {{'type': 'function', 'function': "
                    f"{{'name': ...}}}}, got {choice!r:.200}",
                    param="tool_choice",
                )
            if name not in names:
                raise APIError(
                    f"tool_choice names the function {name!r}, which is not among the tools {names}",
                    param="tool_choice",
                )
        plan.tools, plan.parse_tools, plan.require_call = tools, True, name
        plan.prefix = OPEN + "\n" + ("" if name == "*" else '{"name": ' + json.dumps(name) + ', "arguments": ')
        plan.checked.append("tool_choice")
    else:
        raise APIError(
            f"tool_choice must be 'auto', 'none', 'required' or {{'type': 'function', 'function': "
            f"{{'name': ...}}}}, got {choice!r:.200}",
            param="tool_choice",
        )
    if plan.single_call and plan.parse_tools:
        plan.checked.append("parallel_tool_calls")
    _json_plan(plan, body.get("response_format"))
    return plan


def _json_problem(plan: ReplyPlan, text: str) -> str | None:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:
        return f"the content is not JSON ({e})"
    if plan.json == "json_object" and not isinstance(value, dict):
        return f"the content is JSON but not an object: {type(value).__name__}"
    if plan.validator is not None:
        err = next(iter(plan.validator.iter_errors(value)), None)
        if err is not None:
            return f"the content does not match the schema: {err.message}"
    return None


def build_message(plan: ReplyPlan, text: str, finish: str) -> tuple[dict, str, str | None]:
    """The reply's full text (forced prefix included, cut at a stop string) -> (assistant message,
    finish_reason, problem). ``problem`` says why the reply breaks the plan (None: it does not)."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if not plan.parse_tools:
        return message, finish, _json_problem(plan, text) if plan.json else None
    parsed = parse_hermes(text)
    calls = parsed.calls
    problem = None
    if plan.require_call is not None:
        wanted = plan.offered if plan.require_call == "*" else {plan.require_call}
        if not calls or parsed.errors:
            why = f": {parsed.errors[0]}" if parsed.errors else ""
            problem = f"the reply is not a well-formed tool call{why}"[:300]
        elif any(c.name not in wanted for c in calls):
            problem = f"the reply calls {sorted({c.name for c in calls} - set(wanted))}, not one of {sorted(wanted)}"
    if problem is None and plan.single_call and len(calls) > 1:
        problem = f"the reply makes {len(calls)} tool calls and parallel_tool_calls is false"
    if problem is None and not calls and plan.json:
        problem = _json_problem(plan, text)
    if calls:
        message["content"] = parsed.content or None
        message["tool_calls"] = [
            {"id": call_id(), "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for c in calls
        ]
        finish = "tool_calls"
    return message, finish, problem
