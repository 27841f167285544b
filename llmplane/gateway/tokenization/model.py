"""A model's own tokenizer and chat template, read from its files (``tokenizer.json``,
``tokenizer_config.json``, ``special_tokens_map.json``, ``chat_template.jinja``), applied to a
request as vLLM applies them: messages parsed as vLLM parses them, the template rendered with
transformers' variables, the text encoded without special tokens (a completion prompt with
them). What the gateway cannot reproduce (images, audio, a chat template sent with the request)
raises ``NoTokenIds``. docs/gateway.md, "Tokenization", lists the rules.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

from llmplane.gateway.tokenization.pieces import PieceEncoder
from llmplane.gateway.tokenization.template import ChatTemplate, NoTokenIds, TemplateRefused

SPECIAL_TOKENS = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
)  # fmt: skip
# What a request's chat_template_kwargs may set besides the template's own variables (vLLM
# also lets through transformers' other apply_chat_template parameters, which do not reach
# the template), and what it may not (vLLM and transformers refuse those).
_PASSED = frozenset({"add_generation_prompt", "continue_final_message", "tools", "documents"})
_RESERVED = frozenset({"messages", "conversation", "chat_template", "tokenize", "template_name"})
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
_TEXT_PARTS = frozenset({"text", "input_text", "output_text", "refusal"})
# vLLM drops this first line of a system message (Claude Code's, which changes every request).
_BILLING_HEADER = "x-anthropic-billing-header"
MAX_FILE = 64 << 20  # bytes of tokenizer.json (large vocabularies are a few tens of MB)
# What the gateway checks a model's tokenizer with: its pieces at load, its ids against the
# engine's /tokenize (``Tokenization.check_canary``).
CANARY_CHAT = {
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello! What is 2+2? Answer briefly, please."},
    ],
    "add_generation_prompt": True,
}
CANARY_PROMPT = {"prompt": "The quick brown fox jumps over the lazy dog. 0123456789 ?!"}

log = logging.getLogger("llmplane.gateway.tokenization")


class TokenizerUnavailable(Exception):
    """The model's files have no usable tokenizer."""


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    if path.stat().st_size > MAX_FILE:
        raise TokenizerUnavailable(f"{path} is larger than {MAX_FILE} bytes")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise TokenizerUnavailable(f"{path}: {err}") from None
    return doc if isinstance(doc, dict) else {}


class ModelTokenizer:
    """One model's tokenizer and chat template(s)."""

    def __init__(
        self,
        tokenizer: Any,
        config: dict[str, Any],
        tokenizer_json: dict[str, Any],
        template: str | dict[str, str] | None,
    ) -> None:
        self.tokenizer = tokenizer
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self.pieces = PieceEncoder(tokenizer, tokenizer_json)
        self.special: dict[str, str] = {}  # a token as text, or as an added token's object
        for name in SPECIAL_TOKENS:
            value = config.get(name)
            text = value.get("content") if isinstance(value, dict) else value
            if isinstance(text, str) and text:
                self.special[name] = text
        named = (
            template if isinstance(template, dict) else {"default": template} if template else {}
        )
        self.templates = {name: ChatTemplate(source) for name, source in named.items()}

    @classmethod
    def load(cls, directory: str | Path) -> ModelTokenizer:
        from tokenizers import Tokenizer

        root = Path(directory)
        path = root / "tokenizer.json"
        if not path.is_file():
            raise TokenizerUnavailable(f"no tokenizer.json in {root}")
        tokenizer_json = _read_json(path)
        try:
            tokenizer = Tokenizer.from_str(json.dumps(tokenizer_json))
        except Exception as err:  # the tokenizers library raises its own types
            raise TokenizerUnavailable(f"{path}: {err}") from None
        config = _read_json(root / "special_tokens_map.json") | _read_json(
            root / "tokenizer_config.json"
        )
        template: str | dict[str, str] | None = config.get("chat_template")
        if isinstance(template, list):  # transformers' form of several named templates
            template = {
                t["name"]: t["template"]
                for t in template
                if isinstance(t, dict) and isinstance(t.get("name"), str)
                and isinstance(t.get("template"), str)
            }  # fmt: skip
        jinja_file = root / "chat_template.jinja"
        if jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        if not isinstance(template, str | dict):
            template = None
        try:
            model = cls(tokenizer, config, tokenizer_json, template)
        except TemplateRefused as err:
            raise TokenizerUnavailable(str(err)) from None
        try:
            sample = model.render_chat(CANARY_CHAT) if model.templates else "x"
        except NoTokenIds as err:
            log.warning("%s: the chat template fails on the canary prompt: %s", root, err)
            sample = CANARY_PROMPT["prompt"]
        if not model.pieces.check(sample):
            log.info("%s: the tokenizer encodes whole texts (no piece cache)", root)
        return model

    # -- requests ---------------------------------------------------------------------------

    def chat_ids(self, doc: dict[str, Any]) -> list[int]:
        """The ids vLLM gives a chat request (a /v1/chat/completions or /tokenize body)."""
        text = self.render_chat(doc)
        if doc.get("add_special_tokens") is True:
            return self.tokenizer.encode(text, add_special_tokens=True).ids
        return self.pieces.encode(text)

    def completion_ids(self, doc: dict[str, Any]) -> list[int]:
        """The ids of a completion request's prompt: a string encoded with special tokens
        (unless ``add_special_tokens`` is false); a list of ids as it is; a batch of one."""
        prompt = one_prompt(doc)
        if prompt is None:
            raise NoTokenIds("the prompt is not one string or one list of token ids")
        if isinstance(prompt, list):
            return prompt
        special = doc.get("add_special_tokens", True) is not False
        return self.tokenizer.encode(prompt, add_special_tokens=special).ids

    def render_chat(self, doc: dict[str, Any]) -> str:
        if doc.get("chat_template") is not None:
            raise NoTokenIds("the request brings its own chat template")
        messages = doc.get("messages")
        if not isinstance(messages, list) or not messages:
            raise NoTokenIds("no messages")
        tools = doc.get("tools")
        name = self._template_name(tools)
        template = self.templates[name]
        conversation = _conversation(messages, template)
        kwargs = doc.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, dict):
            raise NoTokenIds("chat_template_kwargs is not an object")
        if _RESERVED.intersection(kwargs):
            raise NoTokenIds("chat_template_kwargs sets what the request itself sets")
        variables: dict[str, Any] = {
            k: v for k, v in kwargs.items() if k in template.variables or k in _PASSED
        }
        for key, default in (("add_generation_prompt", True), ("continue_final_message", False)):
            value = doc.get(key)
            variables[key] = value if isinstance(value, bool) else variables.get(key, default)
        if doc.get("documents") is not None:
            variables["documents"] = doc["documents"]
        if tools is not None:
            variables["tools"] = _tool_dicts(tools)
        return self.render(conversation, template_name=name, **variables)

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = False,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        documents: Any = None,
        template_name: str | None = None,
        **kwargs: Any,
    ) -> str:
        """transformers' ``apply_chat_template(messages, tokenize=False, ...)``."""
        chat = self.templates[template_name or self._template_name(tools)]
        if continue_final_message:
            if add_generation_prompt:
                raise NoTokenIds("continue_final_message with add_generation_prompt")
            messages = copy.deepcopy(messages)
            final = messages[-1].get("content")
            if final is None or "content" not in chat.source:
                raise NoTokenIds("the final message has no content to continue")
            if isinstance(final, list):
                block = next((b for b in reversed(final) if "text" in b), None)
                if block is None:
                    raise NoTokenIds("the final message has no text to continue")
                final = block["text"]
                block["text"] += _CONTINUE_TAG
            else:
                messages[-1]["content"] = final + _CONTINUE_TAG
        # Special tokens first: the request's variables replace them, as in transformers.
        text = chat.render(
            **{**self.special, **kwargs},
            messages=messages, tools=tools, documents=documents,
            add_generation_prompt=add_generation_prompt,
        )  # fmt: skip
        if continue_final_message:
            tag = _CONTINUE_TAG.strip()
            if final.strip() not in text or tag not in text:
                raise NoTokenIds("the chat template drops the final message")
            at = text.rindex(tag)
            text = text[:at] if text.startswith(_CONTINUE_TAG, at) else text[:at].rstrip()
        return text

    def _template_name(self, tools: object) -> str:
        if not self.templates:
            raise NoTokenIds("the model has no chat template")
        if tools is not None and "tool_use" in self.templates:
            return "tool_use"
        if "default" in self.templates:
            return "default"
        if len(self.templates) == 1:
            return next(iter(self.templates))
        raise NoTokenIds("the model has several chat templates and no default")


def _conversation(messages: list[Any], template: ChatTemplate) -> list[dict[str, Any]]:
    """The messages as vLLM parses them for ``template``."""
    out = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise NoTokenIds("a message is not an object with a role")
        role = message["role"]
        texts = _texts(message.get("content"))
        if role == "system":
            texts = [
                t.partition("\n")[2] if t.startswith(_BILLING_HEADER) else t
                for t in texts
                if not (t.startswith(_BILLING_HEADER) and not t.partition("\n")[2])
            ]
        parsed: dict[str, Any] = {"role": role, "content": "\n".join(texts)}
        if template.openai_content and role != "tool":  # tool results stay text
            parsed["content"] = [{"type": "text", "text": t} for t in texts]
        if role == "assistant":
            calls = message.get("tool_calls")
            if calls is not None and calls != []:  # vLLM drops an empty list
                parsed["tool_calls"] = _tool_calls(calls)
            if message.get("reasoning") is not None:
                parsed["reasoning"] = parsed["reasoning_content"] = message["reasoning"]
        elif role == "tool" and "tool_call_id" in message:
            parsed["tool_call_id"] = message["tool_call_id"]
        if isinstance(message.get("name"), str):
            parsed["name"] = message["name"]
        if isinstance(message.get("task"), str):
            parsed["task"] = message["task"]
        if role == "developer":
            parsed["tools"] = message.get("tools")
        out.append(parsed)
    if any(m["role"] == "developer" for m in out) and not (
        '"developer"' in template.source or "'developer'" in template.source
    ):
        out = _developer_as_system(out)
    return out


def one_prompt(doc: dict[str, Any]) -> str | list[int] | None:
    """A completion request's one prompt: a string or a list of token ids (a batch of one
    unwrapped); None for anything else."""
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(type(i) is int for i in prompt):
        return prompt
    return None


def _texts(content: object) -> list[str]:
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise NoTokenIds("message content is neither text nor a list of parts")
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("type") in _TEXT_PARTS:
            text = part.get("refusal" if part["type"] == "refusal" else "text")
            if text is None:
                continue  # vLLM skips it
            if not isinstance(text, str):
                raise NoTokenIds("a text part's text is not text")
            texts.append(text)
        else:
            raise NoTokenIds("a message has content other than text")
    return texts


def _tool_calls(calls: object) -> list[dict[str, Any]]:
    """vLLM's: each call's ``arguments`` decoded to an object (``{}`` when it is not one)."""
    if not isinstance(calls, list):
        raise NoTokenIds("tool_calls is not a list")
    out = []
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise NoTokenIds("a tool call is not a function call")
        call = {**call, "function": dict(call["function"])}
        arguments = call["function"].get("arguments")
        if isinstance(arguments, str) and arguments:
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = None
        call["function"]["arguments"] = arguments if isinstance(arguments, dict) else {}
        out.append(call)
    return out


def _tool_dicts(tools: object) -> list[dict[str, Any]]:
    """The request's tools as vLLM hands them to the template (its pydantic models' dump):
    ``type`` and ``function`` with ``name``, ``description``, ``parameters`` (null when not
    given), ``strict`` and ``defer_loading`` when set (the tool's ``defer_loading`` passed down
    to its function, and kept on the tool); other fields dropped."""
    if not isinstance(tools, list):
        raise NoTokenIds("tools is not a list")
    out = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise NoTokenIds("a tool is not a function with a name")
        dumped = {
            "name": function["name"],
            "description": function.get("description"),
            "parameters": function.get("parameters"),
        }
        if function.get("strict") is not None:
            dumped["strict"] = function["strict"]
        defer = function.get("defer_loading")
        if defer is None:
            defer = tool.get("defer_loading")
        if defer is not None:
            dumped["defer_loading"] = defer
        entry: dict[str, Any] = {"type": tool.get("type", "function"), "function": dumped}
        if tool.get("defer_loading") is not None:
            entry["defer_loading"] = tool["defer_loading"]
        out.append(entry)
    return out


def _developer_as_system(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM's for templates without a developer role: developer messages become system
    messages, merged into one first message when there is more than one or it is not first."""
    converted = []
    for message in conversation:
        if message["role"] == "developer":
            message = {k: v for k, v in message.items() if k != "tools"} | {"role": "system"}
        converted.append(message)
    systems = [i for i, m in enumerate(converted) if m["role"] == "system"]
    if not systems or systems == [0]:
        return converted
    contents = []
    for i in systems:
        content = converted[i].get("content", "")
        if isinstance(content, list):
            content = "\n".join(p["text"] for p in content if "text" in p)
        if content:
            contents.append(content)
    rest = [m for m in converted if m["role"] != "system"]
    return [{"role": "system", "content": "\n\n".join(contents)}, *rest]
