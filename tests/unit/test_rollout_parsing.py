"""Tool-call parsing, verl's truncation, ChatML rendering and dataset loading."""

from __future__ import annotations

import json

import pytest

from verl_sf.rollout.data import DatasetError, load_samples
from verl_sf.rollout.parsing import ToolCall, decode_arguments, parse_hermes, parse_openai_tool_calls
from verl_sf.rollout.render import render_prompt, render_response
from verl_sf.rollout.tools import truncate_tool_text


def test_hermes_blocks_are_read_like_verl() -> None:
    text = ('Let me compute.\n<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(1)"}}\n</tool_call>'
            '<tool_call>{"name": "b", "arguments": {}}</tool_call>')
    content, calls = parse_hermes(text, "c")
    assert content == "Let me compute.\n"
    assert [(c.id, c.name, json.loads(c.arguments), c.error) for c in calls] == [
        ("c0", "code_interpreter", {"code": "print(1)"}, None), ("c1", "b", {}, None)]


def test_hermes_parse_matches_verl_for_well_formed_text() -> None:
    """Same content and calls as verl 0.9.1's HermesToolParser on the same text."""
    import asyncio
    import importlib.util
    import os

    import verl

    # Load verl's parser module by path: importing the agent_loop package pulls in the whole
    # rollout server stack (sglang/vLLM dependencies), which a CPU test machine lacks.
    path = os.path.join(os.path.dirname(verl.__file__), "experimental", "agent_loop", "tool_parser.py")
    spec = importlib.util.spec_from_file_location("_verl_tool_parser", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    HermesToolParser = module.HermesToolParser

    class _IdentityTokenizer:  # verl decodes ids first; hand it the text as "ids"
        def decode(self, ids):
            return ids

    text = 'a<tool_call>\n{"name": "f", "arguments": {"x": [1, "é"]}}\n</tool_call>b<tool_call>{"name": "g", "arguments": {}}</tool_call>'
    verl_content, verl_calls = asyncio.run(HermesToolParser(_IdentityTokenizer()).extract_tool_calls(text))
    content, calls = parse_hermes(text, "id")
    assert content == verl_content
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in verl_calls]


@pytest.mark.parametrize("text, error", [
    ("<tool_call>{not json}</tool_call>", "not valid JSON"),
    ('<tool_call>{"name": "f"}</tool_call>', '"name" and "arguments"'),
    ('<tool_call>["f"]</tool_call>', '"name" and "arguments"'),
    ('<tool_call>{"name": 3, "arguments": {}}</tool_call>', '"name" must be a string'),
    ('<tool_call>{"name": "f", "arguments": {}', "unterminated"),
    ('<tool_call>{"name": "f", "arguments": {}}</tool_call> <tool_call>{"name": "g"', "unterminated"),
])
def test_malformed_hermes_blocks_are_kept_as_errors(text: str, error: str) -> None:
    _, calls = parse_hermes(text, "c")
    assert calls and error in calls[-1].error


def test_plain_text_has_no_calls() -> None:
    assert parse_hermes("#### 42", "c") == ("#### 42", [])


def test_openai_tool_calls() -> None:
    calls = parse_openai_tool_calls([
        {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
        {"type": "function", "function": {"name": "g", "arguments": {"y": 2}}},  # no id, decoded arguments
        {"type": "function", "function": {"arguments": "{}"}},  # no name
    ], "p")
    assert (calls[0].id, calls[0].name, calls[0].arguments, calls[0].error) == ("call_a", "f", '{"x": 1}', None)
    assert (calls[1].id, json.loads(calls[1].arguments)) == ("p1", {"y": 2})
    assert calls[2].error == "tool call has no function name"


def test_decode_arguments_messages() -> None:
    assert decode_arguments(ToolCall("i", "f", '{"code": "x"}')) == ({"code": "x"}, None)
    assert decode_arguments(ToolCall("i", "f", "{bad"))[1].startswith("Invalid JSON in arguments for 'f'")
    assert "expected a JSON object, got list" in decode_arguments(ToolCall("i", "f", "[1]"))[1]


@pytest.mark.parametrize("side, expected", [
    ("left", "(truncated)...789"),
    ("right", "012...(truncated)"),
    ("middle", "0...(truncated)...9"),
])
def test_truncation_matches_verl(side: str, expected: str) -> None:
    assert truncate_tool_text("0123456789", 3, side) == expected
    assert truncate_tool_text("012", 3, side) == "012"


def test_truncation_rejects_unknown_side() -> None:
    with pytest.raises(ValueError, match="tool_response_truncate_side"):
        truncate_tool_text("x", 1, "top")


def test_render_chatml_with_tool_turns() -> None:
    prompt = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    response = [
        {"role": "assistant", "content": "thinking", "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "code_interpreter", "arguments": '{"code": "print(2)"}'}}]},
        {"role": "tool", "tool_call_id": "1", "content": "2"},
        {"role": "assistant", "content": "#### 2"},
    ]
    assert render_prompt(prompt) == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    assert render_response(response) == (
        'thinking\n<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(2)"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n2\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n#### 2<|im_end|>\n")


def _row(**overrides):
    row = {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "q"}],
           "reward_model": {"style": "rule", "ground_truth": "3"},
           "extra_info": {"tools_kwargs": {"code_interpreter": {"create_kwargs": {"ground_truth": "3"}}}}}
    row.update(overrides)
    return row


def test_load_jsonl_and_parquet(tmp_path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [_row(), _row(data_source="aime")]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    for path in (jsonl, parquet):
        samples = load_samples(str(path))
        assert [s.data_source for s in samples] == ["openai/gsm8k", "aime"]
        assert samples[0].messages == [{"role": "user", "content": "q"}]
        assert samples[0].tools_kwargs == {"code_interpreter": {"create_kwargs": {"ground_truth": "3"}}}
    assert len(load_samples(str(jsonl), limit=1)) == 1


@pytest.mark.parametrize("row, error", [
    (_row(prompt=[]), "row 0: 'prompt' must be a non-empty list"),
    (_row(prompt=[{"role": "user"}]), "prompt[0] must have string 'role' and 'content'"),
    (_row(reward_model={}), "'reward_model.ground_truth' is required"),
    (_row(data_source=None), "'data_source'"),
    (_row(extra_info=[1]), "'extra_info' must be an object"),
])
def test_bad_rows_name_the_field(tmp_path, row, error) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(DatasetError) as info:
        load_samples(str(path))
    assert error in str(info.value)


def test_missing_and_broken_files(tmp_path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        load_samples(str(tmp_path / "nope.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n{oops\n')
    with pytest.raises(DatasetError, match="bad.jsonl:2: not JSON"):
        load_samples(str(bad))
