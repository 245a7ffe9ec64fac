#!/usr/bin/env python3
"""Writes expected.json: real chat templates rendered by Python jinja2 exactly as transformers does.

Each case renders one template (testdata/templates/<name>.jinja) with one context through
transformers' own `_compile_jinja_template` (ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True) + loopcontrols, its `tojson` filter, `raise_exception`, `strftime_now`,
`namespace`, `dict`). The context holds exactly the keyword arguments `render_jinja_template`
passes to `render()`: messages, tools (None when not given), documents (None),
add_generation_prompt, and the special tokens (bos_token / eos_token) plus extra kwargs.

Run with the venv that has jinja2 3.1.6 and transformers 5.24.0:
  /tmp/tokfix/venv/bin/python tokenizer/chat/testdata/make_expected.py
"""

import json
import os

import jinja2
import transformers
from transformers.utils.chat_template_utils import _compile_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))

# Special tokens per template: from the matching tokenizer_config.json where we have one
# (Qwen2.5, DeepSeek-V3/R1/V3.1), else the values of the models' published tokenizer_config.json
# (see SOURCES.md). Qwen2.5 has no bos_token (transformers then passes none at all).
SPECIAL_TOKENS = {
    "llama-3.1-8b-instruct": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama-3.2-3b-instruct": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "qwen2.5-7b-instruct": {"eos_token": "<|im_end|>"},
    "mistral-7b-instruct-v0.2": {"bos_token": "<s>", "eos_token": "</s>"},
    "mistral-7b-instruct-v0.3": {"bos_token": "<s>", "eos_token": "</s>"},
    "deepseek-v3": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
    "deepseek-r1": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
    "deepseek-v3.1": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
    "gemma-2-2b-it": {"bos_token": "<bos>", "eos_token": "<eos>"},
    "phi-3-mini-4k-instruct": {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
    "phi-3.5-mini-instruct": {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
}

# Llama-3.2 calls strftime_now() unless date_string is given: pin it so outputs are stable.
EXTRA_KWARGS = {
    "llama-3.1-8b-instruct": {"date_string": "26 Jul 2024"},
    "llama-3.2-3b-instruct": {"date_string": "01 Feb 2025"},
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7.5},
            },
            "required": ["city"],
        },
    },
}

U = "user"
A = "assistant"
S = "system"


def msg(role, content):
    return {"role": role, "content": content}


UNICODE_TEXT = "  Héllo wörld 👋🏽 — 你好，世界!\n\nSecond line\twith tab and \"quotes\" & <tags>  "
TRICKY_TEXT = "{{ not a tag }} {% nor this %} \\n literal backslash-n, <|im_end|> lookalike\r\nCRLF"

# (case name, messages, add_generation_prompt values, extra context)
CONVERSATIONS = [
    ("single_user", [msg(U, "Hello!")], (True, False), {}),
    ("system_multi_turn",
     [msg(S, "You are a terse assistant."), msg(U, "What is 2+2?"), msg(A, "4."),
      msg(U, "And 3+3?")], (True, False), {}),
    ("multi_turn_no_system",
     [msg(U, "Hi"), msg(A, "Hello! How can I help?"), msg(U, "Tell me a joke."),
      msg(A, "Why did the chicken cross the road?"), msg(U, "Why?")], (True, False), {}),
    ("ends_with_assistant",
     [msg(S, "Be nice."), msg(U, "Ping"), msg(A, "Pong")], (False,), {}),
    ("unicode_whitespace",
     [msg(S, "  System with spaces  \n"), msg(U, UNICODE_TEXT), msg(A, " 🤖 Réponse:\n  - ok  \n"),
      msg(U, "\n\nmore\n")], (True,), {}),
    ("tricky_text", [msg(U, TRICKY_TEXT)], (True,), {}),
    ("empty_content", [msg(U, ""), msg(A, ""), msg(U, "x")], (True,), {}),
    ("reasoning_in_content",
     [msg(U, "Think first."), msg(A, "<think>\nhmm\n</think>\n\nThe answer is 42."),
      msg(U, "Thanks")], (True,), {}),
    ("non_alternating", [msg(U, "one"), msg(U, "two")], (True,), {}),
    ("assistant_first", [msg(A, "I start"), msg(U, "ok")], (True,), {}),
    ("unknown_role", [msg(U, "a"), msg("narrator", "b")], (True,), {}),
    ("extra_keys", [msg(U, "Hello!")], (True,),
     {"custom_flag": True, "enable_thinking": True, "thinking": True}),
]

QWEN_TOOL_CONVERSATION = [
    msg(S, "You help with weather."),
    msg(U, "Weather in Zürich and Paris?"),
    {"role": A, "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather",
                                          "arguments": {"city": "Zürich", "unit": "celsius"}}},
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
    ]},
    {"role": "tool", "name": "get_weather", "content": "{\"temp\": 21.5, \"sky\": \"☀️\"}"},
    {"role": "tool", "name": "get_weather", "content": "{\"temp\": 18}"},
    msg(A, "Zürich: 21.5°C and sunny; Paris: 18°C."),
]

LLAMA_TOOL_CONVERSATION = [
    msg(S, "You help with weather."),
    msg(U, "Weather in Zürich?"),
    {"role": A, "tool_calls": [{"type": "function", "function": {
        "name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}]},
    {"role": "tool", "content": "{\"temp\": 21.5}"},
    msg(A, "It is 21.5°C."),
]

MISTRAL_TOOL_CONVERSATION = [
    msg(U, "Weather in Zürich?"),
    {"role": A, "content": None, "tool_calls": [{"id": "abcDEF123", "type": "function", "function": {
        "name": "get_weather", "arguments": {"city": "Zürich"}}}]},
    {"role": "tool", "tool_call_id": "abcDEF123", "content": "{\"temp\": 21.5}"},
    msg(A, "It is 21.5°C."),
    msg(U, "Thanks!"),
]

DEEPSEEK_TOOL_CONVERSATION = [
    msg(S, "You help with weather."),
    msg(U, "Weather in Zürich and Paris?"),
    {"role": A, "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "get_weather",
                                          "arguments": "{\"city\": \"Zürich\"}"}},
        {"type": "function", "function": {"name": "get_weather",
                                          "arguments": "{\"city\": \"Paris\"}"}},
    ]},
    {"role": "tool", "content": "21.5"},
    {"role": "tool", "content": "18"},
    msg(A, "Zürich 21.5°C, Paris 18°C."),
]

TOOL_CONVERSATIONS = {
    "qwen2.5-7b-instruct": QWEN_TOOL_CONVERSATION,
    "llama-3.1-8b-instruct": LLAMA_TOOL_CONVERSATION,
    "llama-3.2-3b-instruct": LLAMA_TOOL_CONVERSATION,
    "mistral-7b-instruct-v0.3": MISTRAL_TOOL_CONVERSATION,
    "deepseek-v3": DEEPSEEK_TOOL_CONVERSATION,
    "deepseek-r1": DEEPSEEK_TOOL_CONVERSATION,
}


# Small templates exercising the interpreter piece by piece (rendered by jinja2 as well).
UNIT_CONTEXT = {"d": {"a": 1, "b": [1, 2.5, None, True, "x'y"]}, "s": "  Hi There  ",
                "msgs": [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"},
                         {"role": "user", "content": "u2"}],
                "n": 7, "f": 0.1, "empty": [], "text": "héllo wörld", "none_value": None}
UNIT_TEMPLATES = [
    # Whitespace control, trim_blocks, lstrip_blocks, comments, trailing newline.
    "a  {{- 'b' -}}  c",
    "{% if true %}\nx\n{% endif %}\ny\n",
    "  {% if true %}x{% endif %}\n  {{ 'y' }}\n  {%+ if true %}z{% endif %}",
    "a {# comment #}\nb {#- trimmed -#}   c\n    {# indented #}\nd",
    "{%- for i in [1, 2] -%}\n  [{{ i }}]\n{%- endfor %}\nend\n\n",
    "line1\r\nline2\r\n",
    "{% if true %}  {% endif %}|{% if true -%}  \n  x{%- endif %}",
    "{{ 'a' }}\n{{ 'b' }}\n",
    # Loops.
    "{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}"
    "{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }}|{% endfor %}",
    "{% for x in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}",
    "{% for x in empty %}x{% else %}empty{% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
    "{% for k, v in d|items %}{{ k }}:{{ v|tojson }} {% endfor %}",
    "{% for k in d %}{{ k }}{% endfor %}",
    "{% for m in msgs if m.role == 'user' %}{{ m.content }}{{ loop.last }} {% endfor %}",
    "{% for i in range(6) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}"
    "{% endif %}{{ i }}{% endfor %}",
    "{% set x = 0 %}{% for i in [1, 2] %}{{ x }}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}",
    "{% for a in [[1, 2], [3, 4]] %}{% for b in a %}{{ loop.index }}{{ b }}{% endfor %}"
    "{{ loop.index }};{% endfor %}",
    # Set, namespace.
    "{% set ns = namespace(count=0, names='') %}{% for m in msgs %}{% set ns.count = ns.count + 1 %}"
    "{% set ns.names = ns.names ~ m.role[0] %}{% endfor %}{{ ns.count }} {{ ns.names }} {{ ns }}",
    "{% set a, b = [1, 2] %}{{ a }}{{ b }}{% set c = 1, 2 %}{{ c }}",
    "{% set t %}x{{ 1 + 1 }}y{% endset %}[{{ t }}]",
    "{% if true %}{% set inner = 'set in if' %}{% endif %}{{ inner }}",
    # Literals and operators.
    "{{ 1/2 }} {{ 4/2 }} {{ 7//2 }} {{ -7//2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 1e20 }}"
    " {{ 0.1 + 0.2 }} {{ 1.5e-7 }} {{ 100.0 }} {{ 1e16 }} {{ 123456789.125 }} {{ -0.0 }} {{ 1_000 }}",
    "{{ 'ab' * 2 }} {{ [1] + [2] }} {{ 'a' ~ 1 ~ none ~ true }} {{ 3 - 1.5 }} {{ -n }} {{ 7.5 // 2 }}",
    "{{ 'a\\tb\\n\\u00e9\\x41\\'q\\\\' }}|{{ \"dq'\" }}|{{ 'adj' 'acent' }}",
    "{{ 1 < 2 < 3 }} {{ 1 < 2 > 3 }} {{ 'a' in 'cat' }} {{ 2 in [1, 2] }} {{ 'a' in d }}"
    " {{ 'z' not in d }} {{ 1 == 1.0 }} {{ true == 1 }} {{ [1, 2] == [1, 2] }} {{ 'b' > 'a' }}",
    "{{ none }} {{ true }} {{ false }} {{ d }} {{ d.b }} {{ (1, 'a') }} {{ (1,) }} {{ () }} {{ {} }}",
    "{{ 'yes' if n > 3 else 'no' }} {{ 'yes' if n > 30 }}| {{ n and 'x' }} {{ 0 or 'y' }}"
    " {{ none or empty }} {{ not n }}",
    # Attribute / subscript / slices.
    "{{ msgs[0]['role'] }} {{ msgs[-1].content }} {{ msgs[1:]|length }} {{ d.b[1:3] }}"
    " {{ d.b[::-1] }} {{ text[1:4] }} {{ text[-5:] }} {{ text[::2] }} {{ d['b'][0] }} {{ msgs.0.role }}",
    "{{ d.missing }}|{{ d['missing'] }}|{{ d.b[10] }}|{{ none_value.x }}|{{ undefined_var }}",
    # Tests.
    "{{ x is defined }} {{ d is defined }} {{ x is undefined }} {{ none_value is none }}"
    " {{ 's' is string }} {{ d is mapping }} {{ d.b is iterable }} {{ 's' is iterable }}"
    " {{ 1 is number }} {{ 1.5 is float }} {{ 1 is integer }} {{ true is boolean }} {{ n is odd }}"
    " {{ n is even }} {{ 9 is divisibleby 3 }} {{ n is not none }} {{ 'ab' is lower }}"
    " {{ d.b is sequence }} {{ n is equalto 7 }} {{ n is sameas 7 }} {{ x is iterable }}",
    # Filters.
    "[{{ s|trim }}] [{{ s|upper }}] [{{ s|lower }}] [{{ 'hELLO wORLD'|capitalize }}]"
    " [{{ 'hello big-world (x)'|title }}] [{{ s|length }}] [{{ text|length }}] [{{ d|length }}]",
    "{{ d|tojson }} {{ d|tojson(indent=2) }} {{ text|tojson }} {{ text|tojson(ensure_ascii=True) }}"
    " {{ d|tojson(separators=(',', ':')) }} {{ {'b': 1, 'a': [] }|tojson(sort_keys=true) }}"
    " {{ 'q\"\\\\\\n\\t\\u0001'|tojson }} {{ 1.0|tojson }} {{ none|tojson }}",
    "{{ ['a', 'b']|join(', ') }} {{ msgs|map(attribute='role')|join('/') }} {{ d.b|join }}"
    " {{ msgs|join(',', attribute='content') }}",
    "{{ x|default('dflt') }} {{ none_value|default('dflt') }} {{ none_value|default('dflt', true) }}"
    " {{ ''|d('empty', boolean=true) }}",
    "{{ d.b|first }} {{ d.b|last }} {{ text|first }} {{ 'abc'|list }} {{ d|list }} {{ 42|string }}"
    " {{ d.b|string }}",
    "{{ 'Hello World'|replace('o', '0') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ '10'|int + 1 }}"
    " {{ '1.5'|int }} {{ 'x'|int(7) }} {{ 3.9|int }} {{ '2.5'|float }} {{ -3|abs }} {{ true|int }}",
    "{{ msgs|selectattr('role', 'equalto', 'user')|list|length }}"
    " {{ msgs|rejectattr('role', 'equalto', 'user')|map(attribute='content')|list }}"
    " {{ [1, 0, 2, none]|select|list }} {{ [1, 2, 3, 4]|reject('odd')|list }}"
    " {{ ['a', 'B']|map('upper')|list }} {{ ['a', 'code_interpreter']|reject('equalto', 'code_interpreter')|list }}",
    "{{ [3, 1]|reverse|list }} {{ 'abc'|reverse }} {{ '<a & b>'|e }} {{ '<x>'|safe }}",
    # Methods.
    "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxaxx'.strip('x') }}|{{ s.split() }}"
    "|{{ 'a,b,,c'.split(',') }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a b c'.rsplit(' ', 1) }}"
    "|{{ 'x</think>y</think>z'.split('</think>')[-1] }}",
    "{{ s.startswith('  H') }} {{ s.endswith(('x', '  ')) }} {{ s.upper() }} {{ s.lower() }}"
    " {{ 'ab cd'.title() }} {{ 'aB'.capitalize() }} {{ 'a-b'.replace('-', '+') }} {{ 'abcb'.find('b') }}"
    " {{ 'abcb'.rfind('b') }} {{ 'abcb'.count('b') }} {{ '-'.join(['a', 'b']) }} {{ 'l1\\nl2'.splitlines() }}",
    "{{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 3) }} {{ d.keys()|list }} {{ d.values()|list|length }}"
    " {{ d.items()|list|first }}",
    # Globals.
    "{{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ dict(a=1, b='x') }} {{ namespace(a=1).a }}"
    " {{ strftime_now is defined }} {{ raise_exception is defined }}",
]
UNIT_ERROR_TEMPLATES = [
    "{{ raise_exception('custom failure: ' ~ n) }}",
    "{{ undefined_var.attr }}",
    "{{ d.missing.attr }}",
    "{{ 'a' + 1 }}",
    "{{ undefined_var + 1 }}",
    "{{ none_value|length }}",
    "{{ 'a' < 1 }}",
    "{{ d.b.append(1) }}",
    "{% set d.x = 1 %}",
    "{% for a, b in [[1, 2, 3]] %}{% endfor %}",
    "{{ 1 / 0 }}",
]


def render(name, template, context):
    case = {"template": name, "context": context}
    try:
        case["output"] = _compile_jinja_template(template).render(**context)
    except jinja2.exceptions.TemplateError as e:
        # raise_exception raises a bare TemplateError; other jinja2 errors are subclasses.
        case["error"] = str(e)
        case["error_type"] = type(e).__name__
    except Exception as e:  # Python errors inside the template (TypeError, ...).
        case["error"] = str(e)
        case["error_type"] = type(e).__name__
    return case


def make_context(name, messages, add_generation_prompt, tools=None, extra=None):
    context = {"messages": messages, "tools": tools, "documents": None,
               "add_generation_prompt": add_generation_prompt}
    context.update(SPECIAL_TOKENS[name])
    context.update(EXTRA_KWARGS.get(name, {}))
    context.update(extra or {})
    return context


def main():
    cases = []
    for name in sorted(SPECIAL_TOKENS):
        with open(os.path.join(HERE, "templates", name + ".jinja"), encoding="utf-8") as f:
            template = f.read()
        for case_name, messages, gen_values, extra in CONVERSATIONS:
            for gen in gen_values:
                case = render(name, template, make_context(name, messages, gen, extra=extra))
                case["case"] = f"{case_name}/gen={gen}"
                cases.append(case)
        if name in TOOL_CONVERSATIONS:
            for gen in (True, False):
                context = make_context(name, TOOL_CONVERSATIONS[name], gen, tools=[WEATHER_TOOL])
                case = render(name, template, context)
                case["case"] = f"tools/gen={gen}"
                cases.append(case)
    unit_cases = []
    for template in UNIT_TEMPLATES + UNIT_ERROR_TEMPLATES:
        case = render("", template, UNIT_CONTEXT)
        del case["template"], case["context"]
        case["source"] = template
        unit_cases.append(case)
    with open(os.path.join(HERE, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({"generator": {"jinja2": jinja2.__version__,
                                 "transformers": transformers.__version__},
                   "cases": cases, "unit_context": UNIT_CONTEXT, "unit_cases": unit_cases},
                  f, ensure_ascii=False, indent=1)
        f.write("\n")
    errors = sum("error" in c for c in cases)
    print(f"wrote {len(cases)} cases ({errors} errors)")


if __name__ == "__main__":
    main()
