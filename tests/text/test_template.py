from __future__ import annotations

import pytest

from trioserve.errors import ChatTemplateError, TextInputError, UnsupportedContentError
from trioserve.http.errors import http_error
from trioserve.text.assets import ModelText
from trioserve.text.prompts import render_chat_text
from trioserve.text.template import ChatOptions, compile_template

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def test_tojson_neither_escapes_html_nor_sorts_keys():
    template = compile_template("{{ x | tojson }}|{{ x | tojson(indent=2) }}")
    out = template.render([], x={"z": "<b>&é</b>", "a": 1})
    assert out.split("|")[0] == '{"z": "<b>&é</b>", "a": 1}'
    assert out.split("|")[1].startswith('{\n  "z"')


def test_loop_controls_trim_blocks_and_strftime_now():
    src = "{% for i in [1,2,3] %}{% if i == 2 %}{% continue %}{% endif %}{{ i }}{% endfor %}\n"
    assert (
        compile_template(src + "{{ strftime_now('%Y') | length }}").render([]) == "134"
    )  # trim_blocks ate the newline


def test_raise_exception_is_a_400_with_the_template_message(harder: ModelText):
    with pytest.raises(ChatTemplateError) as caught:
        render_chat_text(harder, [{"role": "function", "content": "x"}])
    assert http_error(caught.value).status == 400  # what the client reads
    assert caught.value.message == "Unknown role: function"


def test_harder_template_renders_system_tools_parts_and_tool_calls(harder: ModelText):
    messages = [
        {"role": "system", "content": "Be brief <b>"},
        {"role": "user", "content": [{"type": "text", "text": "Wetter in Zürich? 日本 🙂"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'},
                }
            ],
        },
        {"role": "tool", "content": [{"type": "text", "text": "sunny"}], "tool_call_id": "c1"},
    ]
    text = render_chat_text(harder, messages, ChatOptions(tools=TOOLS))
    assert text.startswith("<s><|system|>Be brief <b>")
    # tools dumped as vLLM's pydantic models dump them: description present, null
    assert '{"type": "function", "function": {"name": "get_weather", "description": null' in text
    # arguments given as a JSON string reach the template as an object
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Zürich"}}</tool_call>' in text
    assert "\n<|user|>\nWetter in Zürich? 日本 🙂<|end|>" in text
    assert text.endswith("\n<|tool|>\nsunny<|end|>\n<|assistant|>\n")


def test_default_system_prompt_and_no_generation_prompt(harder: ModelText):
    text = render_chat_text(
        harder, [{"role": "user", "content": "hi"}], ChatOptions(add_generation_prompt=False)
    )
    assert text == "<s><|system|>You are a helpful assistant.<|end|>\n<|user|>\nhi<|end|>"


def test_content_format_follows_the_template(plain: ModelText, harder: ModelText):
    assert compile_template(plain.chat_template).content_format == "string"
    assert compile_template(harder.chat_template).content_format == "openai"
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    # "string" templates get the text parts joined with newlines, as vLLM joins them
    assert "<|user|>\na\nb</s>" in render_chat_text(plain, [{"role": "user", "content": parts}])


def test_non_text_parts_are_refused_with_a_clear_400(plain: ModelText):
    image = {"type": "image_url", "image_url": {"url": "http://x/y.png"}}
    with pytest.raises(UnsupportedContentError) as caught:
        render_chat_text(plain, [{"role": "user", "content": [image]}])
    assert http_error(caught.value).status == 400  # what the client reads
    assert caught.value.param == "messages[0].content[0].type"


def test_continue_final_message_cuts_where_the_message_ends(plain: ModelText):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once upon"}]
    options = ChatOptions(add_generation_prompt=False, continue_final_message=True)
    assert render_chat_text(plain, messages, options).endswith("<|assistant|>\nOnce upon")
    with pytest.raises(TextInputError):
        render_chat_text(plain, messages, ChatOptions(continue_final_message=True))


def test_chat_template_kwargs_reach_the_template_only_if_it_reads_them(plain: ModelText):
    source = "{{ greeting | default('none') }}{{ bos_token }}{{ messages[0]['content'] }}"
    options = ChatOptions(chat_template_kwargs={"greeting": "hey", "unused": 1})
    text = render_chat_text(plain, [{"role": "user", "content": "x"}], options, source)
    assert text == "hey<s>x"
    with pytest.raises(TextInputError):
        render_chat_text(
            plain,
            [{"role": "user", "content": "x"}],
            ChatOptions(chat_template_kwargs={"tokenize": True}),
        )


def test_developer_becomes_system_for_templates_that_do_not_know_it(plain: ModelText):
    text = render_chat_text(
        plain, [{"role": "developer", "content": "rules"}, {"role": "user", "content": "q"}]
    )
    assert "<|system|>\nrules</s>" in text


def test_generation_tag_renders_its_body():
    assert compile_template("a{% generation %}b{% endgeneration %}c").render([]) == "abc"


def test_broken_template_is_a_400():
    with pytest.raises(ChatTemplateError):
        compile_template("{% for x in %}")
