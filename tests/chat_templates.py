"""Chat templates and conversations the tokenization tests render, in-process (unit) and against
real vLLM (integration)."""

from __future__ import annotations

from typing import Any

# A Llama-3.1-style template: bos_token, a system block, tools as JSON, tool calls and results,
# raise_exception on a bad role.
TOOLS_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}{% set rest = messages[1:] %}
{%- else %}{% set system = '' %}{% set rest = messages %}{% endif %}
<|system|>
{{ system }}
{%- if tools is not none %}

Tools:
{% for tool in tools %}{{ tool | tojson(indent=2) }}
{% endfor %}
{%- endif %}</s>
{% for message in rest %}
{%- if message['role'] not in ['user', 'assistant', 'tool'] %}{{ raise_exception('bad role ' + message['role']) }}{% endif %}
<|{{ message['role'] }}|>
{%- if message.tool_calls is defined %}
{%- for call in message.tool_calls %}
call {{ call.function.name }} {{ call.function.arguments | tojson }}
{%- endfor %}
{%- elif message['role'] == 'tool' %}
result {{ message.tool_call_id }}: {{ message['content'] }}
{%- else %}
{{ message['content'] | trim }}
{%- endif %}</s>
{% endfor %}
{%- if add_generation_prompt %}<|assistant|>
{% endif %}"""


CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "hello world"}],
    [
        {"role": "system", "content": "the model serves the gateway"},
        {"role": "user", "content": "why is the prefix cache fast?"},
        {"role": "assistant", "content": "  one block two block  "},
        {"role": "user", "content": "and the </s> token <|user|> inside text?"},
    ],
    [
        {"role": "user", "content": "ünïcödé ✓ 漢字 emoji 🚀 and\ttabs\n\nnew lines"},
        {"role": "assistant", "content": "ok"},
    ],
]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


TOOL_CONVERSATION = [
    {"role": "system", "content": "use tools"},
    {"role": "user", "content": "weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
]
