"""Check that a model's chat template allows token-exact multi-turn rollouts.

Owns: ``check_template`` (runs the checks on a sample multi-turn tool conversation with reasoning,
parallel tool calls and a user follow-up), ``TemplateReport`` and ``render_report`` (text for
``agentrl check-template``). Checks, in order:

* ``has_chat_template`` — the tokenizer carries a template;
* ``renders_tools`` — tool schemas appear in the rendered prompt (skipped with ``tools=[]``); a
  tokenizer set up by ``agentrl.episodes.tokenizer`` passes it with agentrl's tool block;
* ``stop_token`` — the token that ends an assistant turn is found and is a stop id;
* ``prefix`` — at every assistant-turn boundary the text so far is a prefix of the next rendering
  (checked at boundaries, not after every message: Qwen2.5 legitimately closes a block of tool
  messages only after the last one). Templates that rewrite earlier turns — e.g. Qwen3 dropping
  ``<think>`` from earlier assistant turns — fail here;
* ``deltas`` — ``ChatRenderer.prompt_ids`` + sampled ids + ``observation_ids`` decode to exactly
  the template's rendering of the whole conversation;
* ``tokenization`` — how many tokens differ from tokenizing the full text at once. Always passes
  (rollouts never re-tokenize); a non-zero count is listed as a warning, since a model fine-tuned
  on whole-text tokenization sees slightly different splits at turn boundaries.

Does not: load models from disk or the hub (the caller passes a tokenizer), or fix templates.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from agentrl.episodes.chat import ChatRenderer, first_difference, render
from agentrl.episodes.tool_prompt import renders_tools as template_renders_tools
from agentrl.errors import TemplateError

SAMPLE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run Python code and return its stdout.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "The program."}},
                "required": ["code"],
            },
        },
    }
]


def _call(name: str, code: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {{"code": "{code}"}}}}\n</tool_call>'


def sample_conversation(tool_name: str = "python") -> list[dict]:
    """System, user, three tool-using assistant turns (one with two parallel calls), a user
    follow-up, a final answer, and a closing user message. Assistant turns carry ``<think>``."""
    return [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": "What is 17 * 23? Use the tool."},
        {
            "role": "assistant",
            "content": "<think>\nI should run it.\n</think>\n\nLet me compute that.\n"
            + _call(tool_name, "print(17 * 23)"),
        },
        {"role": "tool", "content": "391"},
        {
            "role": "assistant",
            "content": "<think>\nCheck both orders.\n</think>\n\n"
            + _call(tool_name, "print(17 * 23)")
            + "\n"
            + _call(tool_name, "print(23 * 17)"),
        },
        {"role": "tool", "content": "391"},
        {"role": "tool", "content": "391"},
        {"role": "assistant", "content": "<think>\nBoth agree.\n</think>\n\nThe answer is 391."},
        {"role": "user", "content": "And 391 + 9?"},
        {"role": "assistant", "content": "<think>\nEasy.\n</think>\n\n400"},
        {"role": "user", "content": "Thanks!"},
    ]


@dataclass
class TemplateReport:
    ok: bool
    checks: list[tuple[str, bool, str]]
    warnings: list[str] = field(default_factory=list)


def _prefix_check(tok, msgs: list[dict], tools, kw) -> tuple[bool, str]:
    turns = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    for t, a in enumerate(turns):
        prompt = render(tok, msgs[:a], tools=tools, add_generation_prompt=True, **kw)
        after = render(tok, msgs[: a + 1], tools=tools, **kw)
        if not after.startswith(prompt + msgs[a]["content"]):
            return False, (
                f"assistant turn {t}: rendering messages[:{a + 1}] is not its prompt followed by the "
                f"assistant's text, at {first_difference(prompt + msgs[a]['content'], after)}"
            )
        nxt = turns[t + 1] if t + 1 < len(turns) else len(msgs)
        following = render(tok, msgs[:nxt], tools=tools, add_generation_prompt=True, **kw)
        if not following.startswith(after):
            hint = (
                " The template rewrites earlier assistant turns (it drops <think> reasoning),"
                if after.count("<think>") > following.count("<think>")
                else " The template rewrites earlier text,"
            )
            return False, (
                f"prefix property broken after assistant turn {t}: the rendering of messages[:{nxt}] "
                f"does not start with that of messages[:{a + 1}], at {first_difference(after, following)}."
                f"{hint} so the tokens of a rollout would not match what this template shows the model."
            )
    return True, f"holds at all {len(turns)} assistant-turn boundaries"


def _simulate(renderer: ChatRenderer, msgs: list[dict]) -> list[int]:
    """Ids as a rollout builds them: prompt, sampled text + end-of-turn, observation deltas."""
    if renderer.end_of_turn_id is None:
        raise TemplateError(renderer._turn_error or "no end-of-turn token found")
    first = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    ids = renderer.prompt_ids(msgs[:first])
    i = first
    while i < len(msgs):
        ids += renderer.encode(msgs[i]["content"]) + [renderer.end_of_turn_id]
        j = i + 1
        while j < len(msgs) and msgs[j]["role"] != "assistant":
            j += 1
        ids += renderer.observation_ids(msgs[i + 1 : j])
        i = j
    return ids


def check_template(tokenizer, tools: list[dict] | None = None, **template_kwargs) -> TemplateReport:
    """Run every check; ``ok`` is True only if all pass. Never raises for a bad template."""
    checks: list[tuple[str, bool, str]] = []
    warnings: list[str] = []

    def add(name: str, fn) -> bool:
        try:
            passed, detail = fn()
        except TemplateError as e:
            passed, detail = False, str(e)
        except Exception as e:  # a check must report, not crash the CLI
            passed, detail = False, f"{type(e).__name__}: {e}"
        checks.append((name, passed, detail))
        return passed

    if not add(
        "has_chat_template",
        lambda: (
            bool(getattr(tokenizer, "chat_template", None)),
            "present" if getattr(tokenizer, "chat_template", None) else "tokenizer.chat_template is empty",
        ),
    ):
        return TemplateReport(ok=False, checks=checks)

    use_tools = SAMPLE_TOOLS if tools is None else list(tools)
    tool_name = use_tools[0]["function"]["name"] if use_tools else "python"
    msgs = sample_conversation(tool_name)

    def renders_tools():
        if not use_tools:
            return True, "skipped (no tools requested)"
        ok, detail = template_renders_tools(tokenizer, use_tools, **template_kwargs)
        if not ok:
            detail += (
                "; model.tool_prompt=auto or agentrl adds agentrl's tool block (agentrl.episodes.tool_prompt), "
                "or describe the tools in the system prompt yourself and use tools=[]"
            )
        return ok, detail

    add("renders_tools", renders_tools)
    renderer = ChatRenderer(tokenizer, tools=use_tools, **template_kwargs)

    def stop_token():
        if renderer.end_of_turn_id is None:
            return False, renderer._turn_error or "no end-of-turn token found"
        tok = tokenizer.convert_ids_to_tokens(renderer.end_of_turn_id)
        detail = (
            f"assistant turns end with {tok!r} (id {renderer.end_of_turn_id}), followed by glue "
            f"{renderer.glue!r}; stop ids {renderer.stop_token_ids}"
        )
        if renderer.end_of_turn_id != tokenizer.eos_token_id:
            warnings.append(
                f"end-of-turn token {tok!r} is not tokenizer.eos_token; engines must stop on "
                f"ChatRenderer.stop_token_ids, not eos alone"
            )
        return True, detail

    add("stop_token", stop_token)
    add("prefix", lambda: _prefix_check(tokenizer, msgs, use_tools, template_kwargs))
    state: dict = {}

    def deltas():
        ids = _simulate(renderer, msgs)
        expected = render(tokenizer, msgs, tools=use_tools, add_generation_prompt=True, **template_kwargs)
        got = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        state.update(ids=ids, expected=expected)
        if got != expected:
            return (
                False,
                f"prompt + sampled turns + observation deltas differ from the full rendering at "
                f"{first_difference(expected, got)}",
            )
        return (
            True,
            f"{len(ids)} tokens over {sum(m['role'] == 'assistant' for m in msgs)} turns reproduce "
            f"the full rendering exactly",
        )

    if add("deltas", deltas):
        whole = renderer.encode(state["expected"])
        ops = difflib.SequenceMatcher(None, whole, state["ids"], autojunk=False).get_opcodes()
        n = sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in ops if tag != "equal")
        if n:
            warnings.append(
                f"{n} token(s) differ between per-turn encoding and encoding the full text at once "
                f"(informative: rollouts never re-tokenize)"
            )
        checks.append(("tokenization", True, f"{n} token mismatch(es) vs whole-text tokenization"))
    return TemplateReport(ok=all(p for _, p, _ in checks), checks=checks, warnings=warnings)


def render_report(report: TemplateReport) -> str:
    """Plain-text report, one line per check, for the CLI."""
    lines = [
        "chat template: " + ("OK for token-exact multi-turn" if report.ok else "NOT OK for token-exact multi-turn")
    ]
    lines += [f"  [{'PASS' if p else 'FAIL'}] {name}: {detail}" for name, p, detail in report.checks]
    lines += [f"  warning: {w}" for w in report.warnings]
    return "\n".join(lines)
