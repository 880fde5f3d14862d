"""The tool a turn calls, from its output's text (agentpark.connectors.toolcalls).

The texts are what the chat templates and vLLM's tool parsers of the same names write.
transformers is not in this venv: the decoding of real token ids with the make-model
tokenizer, and the call site in the scheduler, run in tests/vllm_real/test_tool_from_output.py.
"""

from __future__ import annotations

import logging

import pytest

from agentpark.connectors.toolcalls import FORMATS, Found, ToolCallReader, find_tool
from agentpark.control.degraded import DegradedCause

HERMES = (
    'Let me look.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n'
    "</tool_call><|im_end|>"
)


def test_hermes_names_the_tool() -> None:
    assert find_tool(HERMES, "hermes") == Found("read_file")
    assert find_tool(HERMES) == Found("read_file")  # auto


def test_several_calls_the_last_is_the_tool() -> None:
    text = (
        '<tool_call>{"name": "grep", "arguments": {}}</tool_call>\n'
        '<tool_call>{"name": "run_tests", "arguments": {"k": "x"}}</tool_call>'
    )
    assert find_tool(text, "hermes").tool == "run_tests"


def test_mistral_both_generations() -> None:
    v11 = 'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}</s>'
    assert find_tool(v11, "mistral") == Found("get_weather")
    brace = '[TOOL_CALLS]get_weather{"city": "Paris"}'
    assert find_tool(brace, "mistral") == Found("get_weather")
    old = '[TOOL_CALLS] [{"name": "a", "arguments": {}}, {"name": "bash", "arguments": {}}]'
    assert find_tool(old, "mistral") == Found("bash")
    assert find_tool(v11).tool == "get_weather"  # auto


def test_llama3_json_with_and_without_the_python_tag() -> None:
    tagged = '<|python_tag|>{"name": "search", "parameters": {"q": "x"}}<|eom_id|>'
    assert find_tool(tagged, "llama3_json") == Found("search")
    bare = ' {"name": "a", "parameters": {}}; {"name": "web.fetch", "arguments": {"u": 1}}'
    assert find_tool(bare, "llama3_json") == Found("web.fetch")
    assert find_tool(tagged).tool == "search"


def test_plain_answers_name_no_tool() -> None:
    for text in ("", "The answer is 42.", '{"name": "Ada", "age": 36}', "[1, 2]", "<tool_"):
        assert find_tool(text) == Found(), text
    # a JSON answer that happens to have "name" is not a llama3 call without arguments
    assert find_tool('{"name": "Ada"}', "llama3_json") == Found()


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>{not json</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": 7}</tool_call>',
        '<tool_call>{"name": "x\\u0000y"}</tool_call>',
        '<tool_call>{"name": "' + "n" * 129 + '"}</tool_call>',
        "[TOOL_CALLS]   ",
        "[TOOL_CALLS]get_weather[ARGS]{broken",
        '<|python_tag|>{"name": "a", "parameters": ',
    ],
)
def test_a_marker_that_does_not_parse_gives_no_tool_and_says_why(text: str) -> None:
    found = find_tool(text)
    assert found.tool is None
    assert found.invalid


def test_a_name_of_128_characters_is_taken() -> None:
    name = "t" * 128
    assert find_tool('<tool_call>{"name": "' + name + '"}</tool_call>').tool == name


def test_a_format_reads_only_its_own_markers() -> None:
    assert find_tool(HERMES, "mistral") == Found()
    assert find_tool('[TOOL_CALLS]f[ARGS]{"a": 1}', "hermes") == Found()
    assert find_tool(HERMES, "none") == Found()
    # auto: a valid call of one format wins over a broken marker of another
    assert find_tool("[TOOL_CALLS] ??? " + HERMES).tool == "read_file"


def test_an_unknown_format_is_refused() -> None:
    assert "hermes" in FORMATS
    with pytest.raises(ValueError, match="tool_call_format"):
        ToolCallReader("qwen9", lambda: None)


def test_a_tokenizer_that_fails_to_load_is_tried_once(caplog: pytest.LogCaptureFixture) -> None:
    calls = []

    def load() -> None:
        calls.append(1)
        raise OSError("no tokenizer.json here")

    reader = ToolCallReader("auto", load)
    with caplog.at_level(logging.WARNING, logger="vllm.agentpark"):
        assert reader.read([1, 2, 3]) == Found()
        assert reader.read([1, 2, 3]) == Found()
    assert calls == [1]
    assert reader.off_why is not None and "no tokenizer.json" in reader.off_why
    assert sum("tools not read" in r.message for r in caplog.records) == 1


def test_no_output_loads_nothing_and_none_never_loads() -> None:
    def load() -> None:
        raise AssertionError("loaded")

    assert ToolCallReader("auto", load).read([]) == Found()
    assert ToolCallReader("none", load).read([5, 6]) == Found()


def test_the_invalid_cause_is_a_known_one() -> None:
    assert DegradedCause.of("tool_call_invalid") is DegradedCause.TOOL_CALL_INVALID
