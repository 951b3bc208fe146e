"""Render conversations with the model's own HF chat template, as token-exact per-turn deltas.

Owns: ``ChatRenderer`` — the initial prompt ids, the ids to append after each assistant turn
(``observation_ids``: tool results and/or user messages plus the next generation prompt,
including the template glue that follows the end-of-turn token), the stop token ids, and the
decoding of an assistant turn's ids to text for the tool-call parser.

How deltas are made: render a fixed dummy conversation ``[user, assistant]`` once, then render
``dummy + new messages`` with the generation prompt and take the text difference; prepend what
the template writes after the assistant's end-of-turn token (e.g. ``"\\n"`` after ``<|im_end|>``).
The real history is never re-rendered, so the cost per turn is flat, and the sampled tokens are
never re-tokenized (tokens are the source of truth). This is exact for any template with the *prefix property* at
assistant-turn boundaries; ``agentrl.episodes.template_check`` verifies that property on a real multi-turn
conversation (the dummy here cannot see e.g. reasoning stripped from earlier turns).

Does not: parse tool calls (``agentrl.tools.calls``), run tools, or decide what ids are masked.
"""

from __future__ import annotations

import json
from collections import OrderedDict

from agentrl.errors import TemplateError

_DUMMY = [
    {"role": "user", "content": "agentrl dummy question"},
    {"role": "assistant", "content": "agentrl dummy answer"},
]
_CACHE_SIZE = 512


def render(
    tokenizer,
    messages: list[dict],
    *,
    tools: list[dict] | None = None,
    add_generation_prompt: bool = False,
    **template_kwargs,
) -> str:
    """The template's text for ``messages``; TemplateError (with the cause) when it cannot render."""
    if not getattr(tokenizer, "chat_template", None):
        raise TemplateError("the tokenizer has no chat_template")
    try:
        return tokenizer.apply_chat_template(
            messages,
            tools=tools or None,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **template_kwargs,
        )
    except TemplateError:
        raise
    except Exception as e:  # jinja raise_exception(), undefined variables, ...: name the roles involved
        roles = [m.get("role") for m in messages]
        raise TemplateError(f"chat template failed to render roles {roles}: {type(e).__name__}: {e}") from e


def first_difference(a: str, b: str, context: int = 30) -> str:
    """Human-readable location of the first character where ``a`` and ``b`` differ."""
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    lo = max(0, i - context)
    return f"char {i}: expected {a[lo : i + context]!r}, got {b[lo : i + context]!r}"


def _key(messages: list[dict]):
    """Cache key of a message list; None (no caching) when it holds unhashable extras."""
    try:
        return tuple(
            tuple(
                sorted(
                    (k, v if isinstance(v, (str, int, float, type(None))) else json.dumps(v, sort_keys=True))
                    for k, v in m.items()
                )
            )
            for m in messages
        )
    except (TypeError, ValueError):
        return None


class ChatRenderer:
    """Token-exact multi-turn rendering with ``tokenizer``'s chat template.

    ``template_kwargs`` go to every ``apply_chat_template`` call (e.g. ``enable_thinking=False``).
    """

    def __init__(self, tokenizer, tools: list[dict] | None = None, **template_kwargs) -> None:
        self.tokenizer = tokenizer
        self.tools = list(tools) if tools else None
        self.template_kwargs = template_kwargs
        self._special = {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
        self._special.update(tokenizer.all_special_ids)
        self._cache: OrderedDict[tuple, list[int]] = OrderedDict()
        self._prefix: str | None = None
        #: id of the token the template writes right after an assistant's content (``<|im_end|>``),
        #: the text it writes after that token (the glue), or why they could not be found
        self.end_of_turn_id: int | None = None
        self.glue: str = ""
        self._turn_error: str | None = None
        try:
            self._prefix = self._render_prefix()
            self._find_end_of_turn(self._prefix)
        except TemplateError as e:
            self._turn_error = str(e)
        eos = tokenizer.eos_token_id
        eos_ids = list(eos) if isinstance(eos, (list, tuple)) else ([] if eos is None else [eos])
        ids = ([self.end_of_turn_id] if self.end_of_turn_id is not None else []) + eos_ids
        self.stop_token_ids: tuple[int, ...] = tuple(dict.fromkeys(ids))

    # -------------------------------------------------------------- rendering
    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        return render(
            self.tokenizer,
            messages,
            tools=self.tools,
            add_generation_prompt=add_generation_prompt,
            **self.template_kwargs,
        )

    def encode(self, text: str) -> list[int]:
        # The template writes BOS itself where it wants one; never let the tokenizer add another.
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """Ids of the full initial prompt (with tools and the generation prompt). Cached: the G
        samples of a group share their prompt."""
        key = ("prompt", _key(messages))
        hit = self._get(key)
        if hit is not None:
            return hit
        return self._put(key, self.encode(self.render(messages, add_generation_prompt=True)))

    def _get(self, key) -> list[int] | None:
        if key is not None and key in self._cache:
            self._cache.move_to_end(key)
            return list(self._cache[key])
        return None

    def _put(self, key, ids: list[int]) -> list[int]:
        if key is not None:
            self._cache[key] = ids
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return list(ids)

    def _render_prefix(self) -> str:
        return self.render(_DUMMY)

    def _find_end_of_turn(self, prefix: str) -> None:
        answer = _DUMMY[-1]["content"]
        at = prefix.rfind(answer)
        if at == -1:
            raise TemplateError("the template does not write an assistant message's content verbatim")
        after = prefix[at + len(answer) :]
        ids = self.encode(after) if after else []
        if not ids or ids[0] not in self._special:
            raise TemplateError(
                f"the template does not end an assistant turn with a special token right after its content "
                f"(it writes {after[:40]!r}); a sampled stop token could not reproduce it"
            )
        added = self.tokenizer.added_tokens_decoder.get(ids[0])
        token = added.content if added is not None else self.tokenizer.convert_ids_to_tokens(ids[0])
        if not after.startswith(token):
            raise TemplateError(f"cannot locate end-of-turn token {token!r} in {after!r}")
        self.end_of_turn_id, self.glue = ids[0], after[len(token) :]

    # -------------------------------------------------------------- deltas
    def observation_ids(self, messages: list[dict]) -> list[int]:
        """Ids to append after an assistant turn that ended with ``end_of_turn_id``: template glue,
        ``messages`` (tool results / user turns) and the next generation prompt."""
        if self._turn_error:
            raise TemplateError(self._turn_error)
        key = _key(messages)
        hit = self._get(key)
        if hit is not None:
            return hit
        full = self.render(_DUMMY + list(messages), add_generation_prompt=True)
        prefix = self._prefix
        assert prefix is not None  # rendered whenever _turn_error is None
        if not full.startswith(prefix):
            # Templates may embed today's date (Llama 3.1); re-render the prefix once before failing.
            self._prefix = prefix = self._render_prefix()
            if not full.startswith(prefix):
                raise TemplateError(
                    "chat template lacks the prefix property after an assistant turn: rendering "
                    f"roles {[m.get('role') for m in messages]} changes the earlier text at "
                    f"{first_difference(prefix, full)}"
                )
        return self._put(key, self.encode(self.glue + full[len(prefix) :]))

    def close_ids(self, sampled_ids: list[int]) -> list[int]:
        """Ids to append to a turn that stopped without a stop token (length cut) before
        ``observation_ids``: ``[end_of_turn_id]``, or ``[]`` if it already ended with a stop id."""
        if sampled_ids and sampled_ids[-1] in self.stop_token_ids:
            return []
        if self.end_of_turn_id is None:
            raise TemplateError(self._turn_error or "no end-of-turn token known")
        return [self.end_of_turn_id]

    def decode(self, ids: list[int]) -> str:
        """Text of an assistant turn for parsing: special tokens (stop ids included) dropped,
        added tokens such as ``<tool_call>`` kept, no whitespace clean-up."""
        kept = [i for i in ids if i not in self._special and i not in self.stop_token_ids]
        return self.tokenizer.decode(kept, skip_special_tokens=False, clean_up_tokenization_spaces=False)
