"""The E2B layer's pure pieces: Connect framing, the guest's answers, the interpreter's events."""

from __future__ import annotations

import json
import struct

import pytest

from verl_sf import off_loop
from verl_sf.e2b import sandboxes
from verl_sf.e2b.connect import ConnectError, end_frame, frame
from verl_sf.e2b.interpreter import error_event, execution_events, result_event
from verl_sf.e2b.sandboxes import MARK, GuestError, call_code, parse_answer
from verl_sf.executor.zygote.messages import NOTE
from verl_sf.models import CellRunResult


def test_frames_are_flag_length_json() -> None:
    data = frame({"event": {"start": {"pid": 7}}})
    flags, length = struct.unpack(">BI", data[:5])
    assert flags == 0 and json.loads(data[5:5 + length]) == {"event": {"start": {"pid": 7}}}
    end = end_frame(ConnectError("not_found", "gone"))
    assert end[0] == 0x02 and json.loads(end[5:]) == {"error": {"code": "not_found", "message": "gone"}}
    assert json.loads(end_frame()[5:]) == {}
    assert ConnectError("no-such-code", "x").code == "internal"


def test_call_code_carries_data_as_one_literal() -> None:
    hostile = "'); import os; os.system('x') #\n\"\"\"\\"
    code = call_code("dispatch", {"op": "fs_stat", "args": {"path": hostile}})
    call = compile(code, "<test>", "eval")  # one expression, whatever the data holds
    assert call.co_names == ("__import__", "dispatch")
    literal = code[code.index("(", len("__import__(")) + 1:-1]
    assert json.loads(eval(literal)) == {"op": "fs_stat", "args": {"path": hostile}}


def test_a_large_payload_is_quoted_in_pieces_as_one_literal(monkeypatch: pytest.MonkeyPatch) -> None:
    """An execution's code past a MiB is encoded and quoted a piece at a time; cut anywhere, the call is
    one expression whose literal is the payload's JSON."""
    monkeypatch.setattr(off_loop, "OFF_LOOP_BYTES", 0)
    hostile = "\\'\"\x7fé😀\ud800\n'''\\\\" * 5
    for piece in (1, 2, 3, 7):
        monkeypatch.setattr(sandboxes, "PIECE_CHARS", piece)
        monkeypatch.setattr(off_loop, "PIECE_CHARS", piece)
        code = call_code("run_cell", {"context": "c", "code": hostile, "envs": {"K": hostile}})
        assert compile(code, "<test>", "eval").co_names == ("__import__", "run_cell")
        literal = code[code.index("(", len("__import__(")) + 1:-1]
        assert json.loads(eval(literal)) == {"context": "c", "code": hostile, "envs": {"K": hostile}}


def test_guest_answers_are_parsed_defensively() -> None:
    assert parse_answer(f"user output\n{MARK}{json.dumps({'ok': [1, 2]})}\n") == [1, 2]
    assert parse_answer(f"{MARK}{{\"ok\": 1}}\n{MARK}{{\"ok\": 2}}\n") == 2  # the last answer counts
    with pytest.raises(GuestError) as refused:
        parse_answer(f"{MARK}{json.dumps({'error': {'code': 'not_found', 'message': 'no file'}})}")
    assert (refused.value.code, str(refused.value)) == ("not_found", "no file")
    for garbage in ("no answer at all", f"{MARK}{{not json", f"{MARK}[1, 2]"):
        with pytest.raises(GuestError) as bad:
            parse_answer(garbage)
        assert bad.value.code == "internal"


def test_result_and_error_events() -> None:
    assert result_event({"text/plain": "'hi'", "image/png": "iVBOR", "x/custom": 1}, True) == {
        "type": "result", "is_main_result": True, "text": "hi", "png": "iVBOR", "extra": {"x/custom": 1}}
    # E2B's server drops single quotes only: a repr in double quotes keeps them.
    assert result_event({"text/plain": '"it\'s"'}, False)["text"] == '"it\'s"'
    traceback = ["---------------------------------------------------------------------------",
                 "ZeroDivisionError                         Traceback (most recent call last)",
                 "Cell In[2], line 1\n----> 1 1/0\n", "ZeroDivisionError: division by zero"]
    event = error_event({"ename": "ZeroDivisionError", "evalue": "division by zero", "traceback": traceback})
    assert (event["name"], event["value"]) == ("ZeroDivisionError", "division by zero")
    assert event["traceback"] == "\n".join(traceback)


def test_execution_events_mark_only_a_shown_value_as_main() -> None:
    run = CellRunResult(stdout="out\n", display=[{"text/plain": "<Figure>", "image/png": "iVBOR"},
                                                 {NOTE: {"count": 3, "main": None}}])
    events = execution_events([run], "")
    assert [e["type"] for e in events] == ["number_of_executions", "stdout", "result"]
    assert events[0]["execution_count"] == 3 and events[2]["is_main_result"] is False
    shown = CellRunResult(display=[{"text/plain": "<HTML>"}, {"text/plain": "42"}, {"image/png": "iVBOR"},
                                   {NOTE: {"count": 4, "main": 1}}])
    events = execution_events([shown], "")
    assert [e["is_main_result"] for e in events if e["type"] == "result"] == [False, True, False]
    # Only the last bundle is the note: one shown before it is a result like any other.
    unnoted = CellRunResult(display=[{NOTE: {"count": 9, "main": 0}}, {"text/plain": "1"}])
    assert [e["type"] for e in execution_events([unnoted], "")] == ["result", "result", "error"]


@pytest.mark.parametrize("note", ["count", {"count": "1"}, {"count": True}, {"count": -5}, {"count": 10**30},
                                  {"main": 0}])
def test_an_execution_without_a_sound_note_is_an_error_not_a_success(note: object) -> None:
    """Code can alter the interpreter that notes an execution: what it then notes is not passed on,
    and the execution says it was not told how it ended."""
    events = execution_events([CellRunResult(stdout="x\n", display=[{"text/plain": "1"}, {NOTE: note}])], "")
    assert [e["type"] for e in events] == ["stdout", "result", "error"]
    assert events[1]["is_main_result"] is False
    assert events[2]["name"] == "ExecutionError" and "altered its interpreter" in events[2]["value"]


def test_a_main_index_out_of_range_marks_no_result() -> None:
    for main in (99, -1, "x", None, True):
        run = CellRunResult(display=[{"text/plain": "1"}, {NOTE: {"count": 2, "main": main}}])
        events = execution_events([run], "")
        assert [e["type"] for e in events] == ["number_of_executions", "result"]
        assert events[1]["is_main_result"] is False
