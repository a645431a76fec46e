"""The real, unmodified E2B SDKs (`e2b`, `e2b-code-interpreter`) against a real `verl-sf serve`.

The SDKs are configured only as their users configure them: E2B_API_URL and E2B_SANDBOX_URL
name the server, E2B_API_KEY carries the key (the server is started with `--e2b-api-key`).
Every test asserts what the SDK hands its caller; a few hostile checks speak raw HTTP.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from e2b import (
    AuthenticationException,
    CommandExitException,
    FileNotFoundException,
    FileType,
    InvalidArgumentException,
    NotFoundException,
    RateLimitException,
    SandboxException,
    SandboxNotFoundException,
    TimeoutException,
)
from e2b_code_interpreter import AsyncSandbox, Sandbox

from tests.host_view import comm, descendants
from tests.server_fixtures import ServerHandle, server_for_sdk, start_server, stop_server
from tests.waiting import wait_until, wait_until_async

API_KEY = "e2b-test-key-3d1f"


def named(server: ServerHandle, name: str) -> list[int]:
    """The server's descendants a run named `name` (prctl; read from the host)."""
    return [pid for pid in descendants(server.process.pid) if comm(pid) == name]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerHandle]:
    with server_for_sdk(lambda url: {"E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": API_KEY},
                        "--slots", "2", "--preload", "", "--e2b-api-key", API_KEY) as handle:
        yield handle


@pytest.fixture
def sandbox(server: ServerHandle) -> Iterator[Sandbox]:
    box = Sandbox.create(timeout=120)
    yield box
    box.kill()


def test_run_code_keeps_state_and_shows_results_and_errors(sandbox: Sandbox) -> None:
    first = sandbox.run_code("import math\nx = 41\nprint('hello')\nx + 1")
    assert first.logs.stdout == ["hello\n"] and first.error is None
    assert first.text == "42" and first.results[0].is_main_result
    assert sandbox.run_code("x * 2").text == "82"  # state kept between calls
    assert sandbox.run_code("'quoted'").text == "quoted"  # E2B drops a string's quotes
    assert sandbox.run_code("import sys\nsys.stderr.write('warn\\n'); None").logs.stderr == ["warn\n"]
    assert sandbox.run_code("y = 1").text is None  # no last expression, no main result

    failed = sandbox.run_code("def f():\n    raise ValueError('bad input')\nf()")
    assert failed.error is not None
    assert (failed.error.name, failed.error.value) == ("ValueError", "bad input")
    assert "raise ValueError('bad input')" in failed.error.traceback
    assert "verl-sf-e2b" not in failed.error.traceback and "Cell In[" in failed.error.traceback
    syntax = sandbox.run_code("def (:")
    assert syntax.error is not None and syntax.error.name == "SyntaxError"
    assert syntax.error.traceback.startswith("  Cell In[7], line 1") and "def (:" in syntax.error.traceback
    assert sandbox.run_code("x").text == "41"  # an error leaves the state alone


def test_cells_run_as_ipython_runs_them(sandbox: Sandbox) -> None:
    indented = sandbox.run_code("    x = 1\n    x + 1")  # a common indent is stripped
    assert indented.error is None and indented.text == "2"
    shown = sandbox.run_code("from IPython.display import display, HTML, Markdown\n"
                             "display(HTML('<i>a</i>'))\ndisplay(Markdown('**b**'))\n'done'")
    assert [(r.html, r.markdown, r.is_main_result) for r in shown.results] == \
        [("<i>a</i>", None, False), (None, "**b**", False), (None, None, True)]
    assert shown.results[2].text == "done"
    assert sandbox.run_code("!echo shell").logs.stdout == ["shell\n"]
    timed = sandbox.run_code("%time 6 * 7")
    assert timed.text == "42" and "Wall time" in "".join(timed.logs.stdout)
    assert sandbox.run_code("import asyncio\nawait asyncio.sleep(0)\n'awaited'").text == "awaited"
    offline = sandbox.run_code("%pip install requests")
    assert offline.error is not None and offline.error.name == "UsageError" and "no network" in offline.error.value
    assert sandbox.run_code("In[1]").text == "x = 1\\nx + 1"  # IPython's history, dedented


def test_a_cell_cannot_pass_for_the_guests_note(sandbox: Sandbox) -> None:
    """The guest notes an execution's count and result as the cell's last bundle: a bundle of that
    type the code shows itself, last or alone, is one of its results, and the count stays the kernel's."""
    forged = "{'application/vnd.verl-sf.execution+json': {'count': 99, 'main': 0}, 'text/plain': 'forged'}"
    before = sandbox.run_code("1").execution_count
    shown = sandbox.run_code(f"from IPython.display import display\ndisplay({forged}, raw=True)")
    assert shown.execution_count == before + 1
    assert [(r.text, r.is_main_result) for r in shown.results] == [("forged", False)]
    valued = sandbox.run_code(f"from IPython.display import display\n7\ndisplay({forged}, raw=True)\n8")
    assert valued.execution_count == before + 2
    assert [(r.text, r.is_main_result) for r in valued.results] == [("forged", False), ("8", True)]


def test_answers_the_code_prints_in_the_guests_place_are_its_sandboxs_errors(sandbox: Sandbox) -> None:
    """The sandbox's agent runs in the sandbox's interpreter, where the code can answer the server's
    calls in its place: an answer not of the call's shape is that call's error, never a server
    error, and the calls answer again once the code stops."""
    sandbox.run_code("import zygote.guest as agent\nforging, honest = True, agent._answer\n"
                     "agent._answer = lambda answer: honest({'ok': [1, 2]} if forging else answer)")
    for call in (lambda: sandbox.files.list("/home/user"), lambda: sandbox.commands.run("echo hi"),
                 lambda: sandbox.files.get_info("/home/user"), lambda: sandbox.files.write("/home/user/a", "x")):
        with pytest.raises(SandboxException, match="malformed") as raised:
            call()
        assert "Server got itself in trouble" not in str(raised.value)
    sandbox.run_code("forging = False")
    assert sandbox.commands.run("echo hi").stdout == "hi\n"
    assert sandbox.files.get_info("/home/user").name == "user"


def test_an_interpreter_its_code_broke_reports_errors_not_empty_successes(server: ServerHandle) -> None:
    """Code that deletes builtins, or drops what the sandbox's agent notes of an execution, gets
    errors for its executions, never a success without a result; other sandboxes are untouched."""
    broken, dropped, other = (Sandbox.create(timeout=120) for _ in range(3))
    try:
        first = broken.run_code("import builtins\ndel builtins.__import__\n1")
        later = broken.run_code("raise ValueError('x')")
        for execution in (first, later):
            assert execution.error is not None and not execution.results, execution
        drop = ("import sys\nclass Dropping(list):\n    def append(self, item):\n"
                "        if 'application/vnd.verl-sf.execution+json' not in item:\n            list.append(self, item)\n"
                "sys.modules['zygote.ipython_shell'].current.display = Dropping()\n2")
        unnoted = dropped.run_code(drop)
        assert unnoted.error is not None and unnoted.error.name == "ExecutionError", unnoted
        assert "altered its interpreter" in unnoted.error.value and unnoted.execution_count is None
        assert dropped.run_code("3").text == "3"  # the next cell's display list is the shell's again
        assert other.run_code("6 * 7").text == "42"
    finally:
        for sandbox in (broken, dropped, other):
            sandbox.kill()


def test_html_and_png_results(sandbox: Sandbox) -> None:
    html = sandbox.run_code("class Table:\n    def _repr_html_(self):\n        return '<b>t</b>'\nTable()")
    assert html.results[0].html == "<b>t</b>" and html.results[0].is_main_result
    plot = sandbox.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.gcf()")
    pngs = [r.png for r in plot.results if r.png]
    assert len(pngs) == 1 and pngs[0].startswith("iVBORw0KGgo")  # base64 of the PNG signature


def test_a_figure_left_open_is_shown_after_the_execution_as_a_kernel_shows_it(sandbox: Sandbox) -> None:
    """The documented chart pattern (`plt.show()`, or a plot call last): the figure is one PNG result
    after the execution's own, and nothing of the sandbox's bookkeeping shows."""
    shown = sandbox.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
    assert shown.error is None and shown.execution_count is not None, shown
    assert [r.formats() for r in shown.results] == [["text", "png"]] and not shown.results[0].is_main_result
    assert shown.logs.stderr == [], shown.logs  # fontconfig finds its configuration
    last = sandbox.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])")
    assert last.error is None, last
    assert [r.formats() for r in last.results] == [["text"], ["text", "png"]]
    assert last.results[0].is_main_result and last.results[0].text.startswith("[<matplotlib.lines.Line2D")


def test_an_execution_with_large_output_arrives_whole_as_json_lines(server: ServerHandle, sandbox: Sandbox) -> None:
    """Every event of an execution, however large, reaches the SDK: the events are one body of JSON
    lines ending with `end_of_execution`, as E2B streams them."""
    code = "print('x' * 300_000)\nimport sys\nprint('y' * 200_000, file=sys.stderr)\n'z' * 100_000"
    execution = sandbox.run_code(code)
    assert "".join(execution.logs.stdout) == "x" * 300_000 + "\n"
    assert "".join(execution.logs.stderr) == "y" * 200_000 + "\n"
    assert execution.results[0].text == "z" * 100_000 and execution.error is None
    raw = requests.post(server.url + "/execute", json={"code": "print(1)\n2"}, timeout=60,
                        headers={"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49999",
                                 "X-Access-Token": sandbox._envd_access_token or ""})
    assert raw.status_code == 200 and raw.text.endswith("\n"), raw.text
    events = [json.loads(line) for line in raw.text.splitlines()]
    assert [event["type"] for event in events] == ["number_of_executions", "stdout", "result", "end_of_execution"]


def test_json_results_nested_past_the_limit_keep_their_text(sandbox: Sandbox) -> None:
    nest = "x = []\ny = x\nfor _ in range({}):\n    y.append([])\n    y = y[0]\n"
    shown = "from IPython.display import JSON, display\ndisplay(JSON({'a': x}))\nprint('after')"
    shallow = sandbox.run_code(nest.format(50) + shown)
    assert shallow.results[0].json is not None and shallow.logs.stdout == ["after\n"], shallow
    deep = sandbox.run_code(nest.format(150) + shown)  # deeper than a record may nest (docs/e2b.md)
    assert deep.error is None and deep.logs.stdout == ["after\n"], deep
    assert deep.results[0].json is None and deep.results[0].text == "<IPython.core.display.JSON object>"


def test_displays_left_out_keep_the_executions_result(sandbox: Sandbox) -> None:
    """Too many displays to send: they are left out, the execution's value stays its main result
    (open-r1 scores `float(execution.text)`), and stderr says what was left out."""
    many = sandbox.run_code("from IPython.display import display\nfor i in range(30000):\n    display(i)\n"
                            "print('done')\n0.75")
    assert many.error is None and many.execution_count is not None, many
    assert [r.text for r in many.results] == ["0.75"] and many.results[0].is_main_result
    assert float(many.text) == 0.75 and many.logs.stdout == ["done\n"]
    assert "30000 of this cell's displays left out" in "".join(many.logs.stderr)
    assert sandbox.run_code("6 * 7").text == "42"


def test_env_vars_per_execution_and_sandbox(server: ServerHandle) -> None:
    box = Sandbox.create(timeout=60, envs={"SANDBOX_WIDE": "yes"})
    try:
        assert box.run_code("import os\nos.environ['SANDBOX_WIDE']").text == "yes"
        assert box.run_code("os.environ.get('ONCE')", envs={"ONCE": "1"}).text == "1"
        assert box.run_code("os.environ.get('ONCE')").text is None  # restored after the execution
    finally:
        box.kill()


def test_named_contexts(sandbox: Sandbox) -> None:
    sandbox.run_code("shared = 'default'")
    context = sandbox.create_code_context(cwd="/tmp")
    assert context.language == "python" and context.cwd == "/tmp"
    assert sandbox.run_code("shared = 'named'\nimport os\nos.getcwd()", context=context).text == "/tmp"
    assert sandbox.run_code("shared").text == "default"  # contexts do not share globals
    assert sandbox.run_code("shared", context=context).text == "named"
    assert context.id in {c.id for c in sandbox.list_code_contexts()}
    sandbox.restart_code_context(context)
    assert sandbox.run_code("shared", context=context).error.name == "NameError"
    sandbox.remove_code_context(context)
    assert context.id not in {c.id for c in sandbox.list_code_contexts()}
    with pytest.raises(NotFoundException):
        sandbox.run_code("1", context=context)


def test_each_context_shows_its_own_last_inputs_and_values(sandbox: Sandbox) -> None:
    """`_i`, `_ii` (the inputs before) and `_`, `__` (the values shown before) are the context's own,
    as in a kernel of its own: not the server's wrapping of the call, nor another context's."""
    assert sandbox.run_code("[globals().get(name) for name in ('_i', '_ii', '_', '__')]").text == \
        "['', '', None, None]"
    sandbox.run_code("6 * 7")
    context = sandbox.create_code_context()
    sandbox.run_code("'other'", context=context)
    assert sandbox.run_code("print((_i, _ii, _, __))").logs.stdout == \
        ["('6 * 7', \"[globals().get(name) for name in ('_i', '_ii', '_', '__')]\", 42, ['', '', None, None])\n"]
    assert sandbox.run_code("_i, _, __", context=context).text == "(\"'other'\", 'other', '')"


def test_a_context_reads_nothing_of_another_or_of_the_servers_calls(sandbox: Sandbox) -> None:
    """Each context is a kernel of its own: another's code, per-execution `envs`, values and last
    error are not in its hidden names, in linecache (where IPython keeps cells' sources) or in `sys`."""
    context = sandbox.create_code_context()
    secret = sandbox.run_code("SECRET_CODE = 1\nraise ValueError('SECRET_ERROR')", context=context,
                              envs={"SECRET_ENV": "SECRET_VALUE"})
    assert secret.error is not None and secret.error.value == "SECRET_ERROR"
    sandbox.run_code("6 * 7", context=context)
    probe = ("import linecache, sys\nshell = get_ipython()\nprint(repr(shell.user_ns_hidden), repr(linecache.cache), "
             "repr(getattr(sys, 'last_value', None)), repr(shell.last_execution_result), "
             "repr(getattr(shell, '_last_input_line', None)), repr(shell.compile._filename_map))")
    seen = "".join(sandbox.run_code(probe).logs.stdout)
    for leaked in ("SECRET", "zygote.guest", "ipython-input-2"):
        assert leaked not in seen, (leaked, seen[:2000])
    assert not re.search(r"\b42\b", seen), seen[:2000]  # the other context's value (an address may hold "42")
    # The contexts share one interpreter (docs/e2b.md), but what the server's calls carried, such as
    # another execution's `envs`, is held nowhere in it once that execution is over.
    held = sandbox.run_code("import gc\nneedle = 'SECRET_' + 'VALUE'  # the probe's own source must not match\n"
                            "sum(needle in repr(o) for o in gc.get_objects() "
                            "if isinstance(o, (dict, list, tuple)) and o is not globals())")
    assert held.text == "0", held
    again = sandbox.run_code("import linecache, sys\nprint(any('SECRET_CODE' in ''.join(entry[2]) for entry in "
                             "linecache.cache.values()), repr(sys.last_value))", context=context)
    assert again.error is None and again.logs.stdout == ["True ValueError('SECRET_ERROR')\n"], again  # its own


def test_files_both_encodings_and_filesystem_calls(sandbox: Sandbox) -> None:
    info = sandbox.files.write("/home/user/data/notes.txt", "line one\n")  # multipart upload
    assert info.path == "/home/user/data/notes.txt" and info.type == FileType.FILE
    payload = bytes(range(256)) * 4
    sandbox.files.write("blob.bin", payload, use_octet_stream=True)  # relative: the home directory
    assert sandbox.files.read("/home/user/blob.bin", format="bytes") == bytearray(payload)
    assert sandbox.files.read("data/notes.txt") == "line one\n"
    # Code and commands see the same files, by relative path or under /home/user, which is their cwd.
    assert sandbox.run_code("open('data/notes.txt').read()").text == "line one\\n"
    assert sandbox.run_code("open('/home/user/data/notes.txt').read()").text == "line one\\n"
    assert sandbox.run_code("import os\nos.getcwd(), os.environ['HOME']").text == "('/home/user', '/home/user')"
    assert sandbox.commands.run("wc -c < blob.bin").stdout.strip() == "1024"
    assert sandbox.commands.run("pwd; wc -c < /home/user/blob.bin").stdout.split() == ["/home/user", "1024"]
    assert sandbox.commands.run("pwd", cwd="/home/user/data").stdout == "/home/user/data\n"

    names = {entry.name: entry for entry in sandbox.files.list("/home/user")}
    assert names["data"].type == FileType.DIR and names["blob.bin"].size == 1024
    assert sandbox.files.get_info("/home/user/blob.bin").size == 1024
    assert sandbox.files.make_dir("/home/user/made") is True
    assert sandbox.files.make_dir("/home/user/made") is False  # exists already
    moved = sandbox.files.rename("/home/user/data/notes.txt", "/home/user/made/notes.txt")
    assert moved.path == "/home/user/made/notes.txt"
    assert not sandbox.files.exists("/home/user/data/notes.txt")
    sandbox.files.remove("/home/user/made")
    assert not sandbox.files.exists("/home/user/made/notes.txt")
    with pytest.raises(FileNotFoundException):
        sandbox.files.read("/home/user/missing.txt")

    big = os.urandom(3 << 20)  # past the inline answer: read through the session's file fetch
    sandbox.files.write("/tmp/big.bin", big)
    assert bytes(sandbox.files.read("/tmp/big.bin", format="bytes")) == big
    sandbox.commands.run("head -c 40M /dev/zero > /tmp/huge.bin")
    with pytest.raises(SandboxException, match=r"'/tmp/huge.bin' is 41943040 bytes: a read returns at most 33554432"):
        sandbox.files.read("/tmp/huge.bin")


def test_write_files_puts_each_file_at_its_own_path(server: ServerHandle, sandbox: Sandbox) -> None:
    """The SDK's `write_files` names each multipart part by its path, absolute or not, as envd reads it."""
    from e2b.sandbox.filesystem.filesystem import WriteEntry

    written = sandbox.files.write_files([WriteEntry(path="/home/user/w/a.txt", data="a"),
                                         WriteEntry(path="/tmp/w/b.txt", data="b"), WriteEntry(path="w/c.txt", data="c")])
    assert sorted(info.path for info in written) == ["/home/user/w/a.txt", "/home/user/w/c.txt", "/tmp/w/b.txt"]
    found = sandbox.commands.run("find /home/user/w /tmp/w -type f | sort").stdout.split()
    assert found == ["/home/user/w/a.txt", "/home/user/w/c.txt", "/tmp/w/b.txt"], found
    twice = requests.post(server.url + "/files", timeout=30, files=[("file", ("/tmp/w/d", b"1")), ("file", ("/tmp/w/d", b"2"))],
                          headers={"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49983",
                                   "X-Access-Token": sandbox._envd_access_token or ""})
    assert twice.status_code == 400 and "same path" in twice.json()["message"], twice.text
    spelled = requests.post(server.url + "/files", timeout=30, headers={
        "E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49983",
        "X-Access-Token": sandbox._envd_access_token or ""},
        files=[("file", ("w/e", b"1")), ("file", ("/home/user/w/./e", b"2"))])  # one file, spelled twice
    assert spelled.status_code == 400 and "same path" in spelled.json()["message"], spelled.text
    # What the kernel refuses is the caller's request, named: never an internal error.
    with pytest.raises(InvalidArgumentException, match="cross-device"):
        sandbox.files.rename("/home/user/w/a.txt", "/tmp/w/a.txt")  # /home/user and /tmp are mounts of their own
    with pytest.raises(InvalidArgumentException, match="nested too deep|too long"):
        sandbox.files.make_dir("/home/user/" + "d/" * 3000)
    sandbox.commands.run("mkfifo /home/user/w/fifo")
    with pytest.raises(InvalidArgumentException, match="not a regular file"):  # at once, not at its time-out
        sandbox.files.read("/home/user/w/fifo", request_timeout=20)
    # Written too (red team, 2026-11-30: the write waited 60 s for a reader and answered a time-out).
    with pytest.raises(InvalidArgumentException, match="not a regular file"):
        sandbox.files.write("/home/user/w/fifo", "x", request_timeout=20)
    reader = sandbox.commands.run("cat /home/user/w/fifo > /dev/null", background=True)
    try:
        time.sleep(0.5)  # a reader waits on it: the write opens, and is refused all the same
        with pytest.raises(InvalidArgumentException, match="not a regular file"):
            sandbox.files.write("/home/user/w/fifo", "x", request_timeout=20)
    finally:
        reader.kill()
    # A tree past Python's recursion limit is removed like any other (it was an internal error).
    sandbox.run_code("import os\nos.makedirs('/home/user/deep')\nos.chdir('/home/user/deep')\nfor _ in range(1500):\n"
                     "    os.mkdir('d')\n    os.chdir('d')\nos.chdir('/home/user')")
    sandbox.files.remove("/home/user/deep")
    assert not sandbox.files.exists("/home/user/deep")
    sandbox.files.write("/home/user/empty", b"")  # no data beside the call's JSON is still a file, empty
    assert sandbox.files.read("/home/user/empty") == ""
    # A socket, a device with nothing behind it: the caller's path, never a server error (red team, 2026-11-30: 500).
    sandbox.run_code("import socket\nheld = socket.socket(socket.AF_UNIX)\nheld.bind('/home/user/sock')")
    for path in ("/home/user/sock", "/dev/tty"):
        with pytest.raises(InvalidArgumentException):
            sandbox.files.read(path, request_timeout=20)
    # A listing past its cap asks for a smaller one, not to retry later (it was E2B's rate-limit error).
    sandbox.run_code("import os\nos.mkdir('/home/user/many')\nfor i in range(3001):\n"
                     "    open(f'/home/user/many/{i}', 'w').close()")
    with pytest.raises(InvalidArgumentException, match="more than 3000 entries"):
        sandbox.files.list("/home/user/many")


def test_a_write_the_full_disk_refuses_leaves_what_was_there(sandbox: Sandbox) -> None:
    """A write is whole or not at all (2026-12-06: the file was truncated, then half written), and leaves
    no temporary file beside it."""
    from e2b import NotEnoughSpaceException

    sandbox.files.write("/tmp/kept.txt", "old")
    filled = sandbox.run_code("import os\ni = 0\nwhile True:\n    try:\n        with open(f'/tmp/fill{i}', 'wb') as f:\n"
                              "            f.write(b'x' * (16 << 20))\n    except OSError:\n        break\n    i += 1\n"
                              "print(i)")
    assert filled.error is None and int(filled.logs.stdout[0]) > 0, filled
    with pytest.raises(NotEnoughSpaceException):
        sandbox.files.write("/tmp/kept.txt", "new " * 100_000)
    assert sandbox.files.read("/tmp/kept.txt") == "old"
    assert not [entry.name for entry in sandbox.files.list("/tmp") if entry.name.startswith(".verl-sf")]


def test_commands_foreground(sandbox: Sandbox) -> None:
    result = sandbox.commands.run("echo $GREETING; pwd; echo oops >&2", envs={"GREETING": "hi"}, cwd="/tmp")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "hi\n/tmp\n", "oops\n")
    assert sandbox.commands.run("pwd").stdout == "/home/user\n"  # the home directory, as E2B says it
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("echo partial; exit 3")
    assert failed.value.exit_code == 3 and failed.value.stdout == "partial\n"
    started = time.monotonic()
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 30", timeout=2)
    assert time.monotonic() - started < 20
    # Many lines over several polls arrive whole and in order.
    lines = sandbox.commands.run("for i in $(seq 1 3000); do echo line-$i; done; sleep 0.5; echo end").stdout
    assert lines.splitlines() == [f"line-{i}" for i in range(1, 3001)] + ["end"]


def test_a_commands_timeout_kills_it_though_the_sdk_left_first(sandbox: Sandbox) -> None:
    """The SDK closes its stream at `timeout`, just before the server's deadline: the command is
    killed at it all the same (nothing of it runs on, as with envd)."""
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 3; echo late > /home/user/late.txt", timeout=1)
    wait_until(lambda: not [p for p in sandbox.commands.list() if "late.txt" in " ".join(p.args)], 5,
               "the command is killed at its timeout")
    time.sleep(3)
    assert not sandbox.files.exists("/home/user/late.txt")


def test_commands_background_wait_and_kill(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("sleep 0.5; echo finished", background=True)
    assert handle.wait().stdout == "finished\n"

    sleeper = sandbox.commands.run("sleep 60", background=True)
    assert sleeper.pid in {p.pid for p in sandbox.commands.list()}
    # Code runs while the command does: calls of one sandbox take turns, none waits for the command.
    assert sandbox.run_code("6 * 7").text == "42"
    assert sandbox.commands.kill(sleeper.pid) is True
    with pytest.raises(CommandExitException) as killed:
        sleeper.wait()
    assert killed.value.exit_code != 0
    assert sleeper.pid not in {p.pid for p in sandbox.commands.list()}
    assert sandbox.commands.kill(999_999) is False


def test_set_timeout_and_reaping(server: ServerHandle) -> None:
    box = Sandbox.create(timeout=60)
    box.set_timeout(2)
    assert box.get_info().end_at.timestamp() - time.time() < 5
    wait_until(lambda: box.sandbox_id not in {s.sandbox_id for s in Sandbox.list().next_items()}, 30,
               "the timed-out sandbox is reaped", every=0.5)
    with pytest.raises(SandboxNotFoundException):
        box.get_info()
    with pytest.raises(NotFoundException, match="reached its timeout"):
        box.run_code("1")
    assert box.is_running() is False


def test_a_command_running_when_its_sandbox_times_out_is_told_so(server: ServerHandle) -> None:
    """Its end reaches the command in flight as the sandbox's own reason (it said "ended by DELETE
    /sessions", a red team saw, where the next call said the sandbox reached its timeout)."""
    box = Sandbox.create(timeout=60)
    box.set_timeout(2)
    with pytest.raises(Exception) as ended:
        box.commands.run("sleep 30", timeout=40)
    assert "reached its timeout" in str(ended.value) and "DELETE" not in str(ended.value), repr(ended.value)


def test_kill_ends_the_sandbox(server: ServerHandle) -> None:
    box = Sandbox.create(timeout=60, metadata={"purpose": "kill-test"})
    listed = Sandbox.list(query=_query({"purpose": "kill-test"})).next_items()
    assert [s.sandbox_id for s in listed] == [box.sandbox_id]
    assert box.is_running() is True
    box.kill()
    assert box.is_running() is False
    assert Sandbox.kill(box.sandbox_id) is False  # a second kill finds nothing
    with pytest.raises(NotFoundException):
        box.run_code("1")
    with pytest.raises(SandboxException):
        box.files.read("/home/user/anything")
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(box.sandbox_id)


def _query(metadata: dict[str, str]):  # type: ignore[no-untyped-def]
    from e2b import SandboxQuery

    return SandboxQuery(metadata=metadata)


def test_access_tokens_and_api_key(server: ServerHandle, sandbox: Sandbox) -> None:
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="not-the-key")
    # With --e2b-api-key no other key is a tenant: every call is 401, whatever sandbox it names.
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key="not-the-key").next_items()
    for call in (Sandbox.get_info, Sandbox.connect, Sandbox.kill, lambda i, **o: Sandbox.set_timeout(i, 5, **o)):
        with pytest.raises(AuthenticationException):
            call(sandbox.sandbox_id, api_key="not-the-key")
    for method, path in (("GET", ""), ("DELETE", ""), ("POST", "/timeout"), ("POST", "/connect"), ("POST", "/pause")):
        refused = requests.request(method, f"{server.url}/sandboxes/{sandbox.sandbox_id}{path}", json={"timeout": 5},
                                   headers={"X-API-Key": API_KEY + "x"}, timeout=30)
        assert refused.status_code == 401 and "Token" not in refused.text, (method, path, refused.text)
    assert sandbox.is_running() and sandbox.run_code("1 + 1").text == "2"
    other = Sandbox.create(timeout=60)
    try:
        headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "X-Access-Token": other._envd_access_token}
        envd = requests.post(server.url + "/filesystem.Filesystem/ListDir", json={"path": "/home/user"},
                             headers={**headers, "E2b-Sandbox-Port": "49983"}, timeout=30)
        assert envd.status_code == 401 and envd.json()["code"] == "unauthenticated"
        execute = requests.post(server.url + "/execute", json={"code": "1"},
                                headers={**headers, "E2b-Sandbox-Port": "49999"}, timeout=30)
        assert execute.status_code == 401
        download = requests.get(server.url + "/files", params={"path": "/home/user/x"},
                                headers={"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49983"},
                                timeout=30)
        assert download.status_code == 401  # no token at all
    finally:
        other.kill()


def test_sandboxes_do_not_see_each_other(server: ServerHandle) -> None:
    first, second = Sandbox.create(timeout=60), Sandbox.create(timeout=60)
    try:
        first.files.write("/home/user/secret.txt", "first's secret")
        first.run_code("open('/tmp/secret2.txt', 'w').write('more')\nimport subprocess\n"
                       "p = subprocess.Popen(['sleep', '60'])")
        probe = second.run_code(
            "import os, glob\n"
            "found = [p for p in ('/workdir/secret.txt', '/tmp/secret2.txt') if os.path.exists(p)]\n"
            "found += glob.glob('/proc/*/root/workdir/secret.txt') + glob.glob('/proc/*/cwd/secret.txt')\n"
            "procs = [open(f'/proc/{p}/cmdline').read() for p in os.listdir('/proc') if p.isdigit()]\n"
            "(found, any('sleep' in c for c in procs))")
        assert probe.error is None and probe.text == "([], False)"
        with pytest.raises(FileNotFoundException):
            second.files.read("/home/user/secret.txt")
        assert second.commands.run("ls -A /workdir /tmp").stdout.count("secret") == 0
        assert first.files.read("/home/user/secret.txt") == "first's secret"
        # The files API has the sandbox's own rights and view: the system is read-only, the host unseen.
        with pytest.raises(SandboxException):
            second.files.write("/usr/local/bin/planted", "x")
        assert not os.path.exists("/usr/local/bin/planted")
        with pytest.raises(SandboxException):
            second.files.write("/etc/planted", "x")
        assert not os.path.exists("/etc/planted")
        with pytest.raises(SandboxException):  # host root's home: absent or unreadable, never listed
            second.files.list("/root")
    finally:
        first.kill()
        second.kill()


@pytest.mark.parametrize(("body", "field", "says"), [
    ({"envVars": {"A=B": "1"}}, "envVars", "not a variable name"),
    ({"envVars": {"": "1"}}, "envVars", "not a variable name"),
    ({"envVars": {"A\u0000": "1"}}, "envVars", "not a variable name"),
    ({"envVars": {"A": "x\u0000y"}}, "envVars", "NUL"),
    ({"envVars": {f"V{i}": "" for i in range(5000)}}, "envVars", "more than 4096"),
    ({"envVars": {"BIG": "x" * (2 << 20)}}, "envVars", "bytes, more than"),
    ({"metadata": {"k": "v" * (1 << 20)}}, "metadata", "bytes, more than"),
])
def test_environment_and_metadata_a_sandbox_cannot_hold_are_400_naming_them(
        server: ServerHandle, sandbox: Sandbox, body: dict[str, Any], field: str, says: str) -> None:
    """Refused before any sandbox starts (no traceback from inside one), the server holding none of it."""
    created = requests.post(server.url + "/v2/sandboxes", json={"templateID": "base", "timeout": 30, **body},
                            headers={"X-API-Key": API_KEY}, timeout=60)
    assert created.status_code == 400, created.text[:500]
    message = created.json()["message"]
    assert message.startswith(field) and says in message and "Traceback" not in message, message[:500]
    if field == "envVars":  # and per execution: the code interpreter's /execute
        execute = requests.post(server.url + "/execute", json={"code": "1", "env_vars": body["envVars"]}, timeout=60,
                                headers={"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49999",
                                         "X-Access-Token": sandbox._envd_access_token or ""})
        assert execute.status_code in (400, 422) and "env_vars" in execute.text, execute.text[:500]
    assert sandbox.run_code("1 + 1").text == "2"


def test_bad_input_gets_clear_errors(server: ServerHandle, sandbox: Sandbox) -> None:
    key = {"X-API-Key": API_KEY}
    missing = requests.post(server.url + "/v2/sandboxes", json={"timeout": 10}, headers=key, timeout=30)
    assert missing.status_code == 400 and "templateID" in missing.json()["message"]
    too_long = requests.post(server.url + "/v2/sandboxes", json={"templateID": "base", "timeout": 10**7},
                             headers=key, timeout=30)
    assert too_long.status_code == 400 and "timeout" in too_long.json()["message"]
    for timeout in (True, 5.0, "5"):  # E2B's API takes an integer, as Go decodes it (red team, 2026-11-30)
        typed = requests.post(server.url + "/v2/sandboxes", json={"templateID": "base", "timeout": timeout},
                              headers=key, timeout=30)
        assert typed.status_code == 400 and "timeout" in typed.json()["message"], (timeout, typed.text)
    assert requests.get(server.url + "/v2/sandboxes", timeout=30).status_code == 401  # no key
    for field, value in (("nextToken", "9" * 5000), ("nextToken", "\u00b2"), ("nextToken", "x"), ("limit", "\u00b2"),
                         ("limit", "9" * 5000), ("limit", "0"), ("metadata", "a"), ("state", "bogus"),
                         ("state", "running,")):
        page = requests.get(server.url + "/v2/sandboxes", params={field: value}, headers=key, timeout=30)
        assert page.status_code == 400 and field in page.json()["message"], (field, value, page.text)
    for duration in (b"1e400", b'"' + b"9" * 5000 + b'"', b"-1", b"1.5", b'"soon"', b"true", b"2.0"):
        refresh = requests.post(f"{server.url}/sandboxes/{sandbox.sandbox_id}/refreshes", timeout=30,
                                data=b'{"duration": ' + duration + b"}",
                                headers={**key, "Content-Type": "application/json"})
        assert refresh.status_code == 400 and "duration" in refresh.json()["message"], (duration, refresh.text)
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49983",
               "X-Access-Token": sandbox._envd_access_token}
    garbled = requests.post(server.url + "/filesystem.Filesystem/Stat", data=b"{not json",
                            headers={**headers, "Content-Type": "application/json"}, timeout=30)
    assert garbled.status_code == 400 and garbled.json()["code"] == "invalid_argument"
    wrong_type = requests.post(server.url + "/filesystem.Filesystem/Stat", json={"path": 5}, headers=headers,
                               timeout=30)
    assert wrong_type.status_code == 400 and "path" in wrong_type.json()["message"]
    superscript_two = "\u00b2".encode().decode("latin-1")  # a digit to str.isdigit, not to int()
    deadline = requests.post(server.url + "/filesystem.Filesystem/Stat", json={"path": "/home/user"}, timeout=30,
                             headers={**headers, "Connect-Timeout-Ms": superscript_two})
    assert deadline.status_code == 400 and "Connect-Timeout-Ms" in deadline.json()["message"]
    start = json.dumps({"process": {"cmd": "echo", "args": ["hi"]}}).encode()
    for name in ("Connect-Timeout-Ms", "Keepalive-Ping-Interval"):
        stream = requests.post(server.url + "/process.Process/Start", timeout=30,
                               data=struct.pack(">BI", 0, len(start)) + start,
                               headers={**headers, name: superscript_two, "Content-Type": "application/connect+json"})
        assert stream.status_code == 200 and stream.content.endswith(b"}"), (name, stream.content)
    plain = requests.post(server.url + "/process.Process/Start", json={"process": {"cmd": "echo"}}, headers=headers,
                          timeout=30)  # not a Connect stream: it says what a stream takes
    assert b"invalid_argument" in plain.content and b"application/connect+json" in plain.content, plain.content
    nul_query = requests.post(server.url + "/files", params={"path": "/home/user/a\x00b"}, data=b"x", timeout=30,
                              headers={**headers, "Content-Type": "application/octet-stream"})
    assert nul_query.status_code == 400 and "NUL" in nul_query.json()["message"], nul_query.text
    nul_part = requests.post(server.url + "/files", files={"file": ("a\x00b", b"x")}, headers=headers, timeout=30)
    assert nul_part.status_code == 400 and "malformed" in nul_part.json()["message"], nul_part.text
    not_utf8 = requests.post(server.url + "/files", timeout=30, headers={
        **headers, "Content-Type": "multipart/form-data; boundary=XX"}, data=b'--XX\r\nContent-Disposition: form-data; '
        b'name="file"; filename="\xff\xfe"\r\n\r\nhello\r\n--XX--\r\n')
    assert not_utf8.status_code == 400 and "not UTF-8" in not_utf8.json()["message"], not_utf8.text
    with pytest.raises(SandboxException, match="not implemented"):
        sandbox.files.watch_dir("/home/user")
    # Metrics of many sandboxes: not implemented, rather than "no sandbox named metrics" (red team, 2026-11-30).
    many = requests.get(server.url + "/sandboxes/metrics", params={"sandbox_ids": sandbox.sandbox_id}, headers=key,
                        timeout=30)
    assert many.status_code == 501 and "not implemented" in many.json()["message"], many.text
    assert requests.get(server.url + "/sandboxes/metrics", timeout=30).status_code == 401  # no key
    surrogate = requests.post(server.url + "/execute", data=b'{"code": "x = \\ud800"}', timeout=30,
                              headers={"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49999",
                                       "E2B-Traffic-Access-Token": sandbox.traffic_access_token or "",
                                       "Content-Type": "application/json"})
    assert surrogate.status_code == 422 and "code" in surrogate.text and "surrogate" in surrogate.text
    unknown = requests.post(server.url + "/execute", json={"code": "1"}, timeout=30,
                            headers={"E2b-Sandbox-Id": "inope", "E2b-Sandbox-Port": "49999"})
    assert unknown.status_code == 401 and "access token" in unknown.text  # as for a sandbox that exists
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect("i-no-such-sandbox")
    nested = b"[" * 5000 + b"]" * 5000
    for url, extra in ((server.url + "/v2/sandboxes", key), (server.url + "/execute", {
            "E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49999",
            "E2B-Traffic-Access-Token": sandbox.traffic_access_token or ""})):
        deep = requests.post(url, data=nested, headers={**extra, "Content-Type": "application/json"}, timeout=30)
        assert deep.status_code == 400 and "deeper than 100 levels" in deep.text, (url, deep.text)
    deep_stat = requests.post(server.url + "/filesystem.Filesystem/Stat", data=nested, timeout=30,
                              headers={**headers, "Content-Type": "application/json"})
    assert deep_stat.status_code == 400 and "deeper than 100 levels" in deep_stat.json()["message"]
    assert sandbox.run_code("1 + 1").text == "2"  # the server still serves everyone


def test_async_calls_on_one_sandbox_take_turns(server: ServerHandle) -> None:
    async def main() -> tuple[list[str], str]:
        sandbox = await AsyncSandbox.create(timeout=60)
        try:
            context = await sandbox.create_code_context()
            executions = await asyncio.gather(
                sandbox.run_code("import time\ntime.sleep(1)\norder = ['default']\n'slow'"),
                sandbox.run_code("'fast'", context=context),
                sandbox.files.write("/home/user/f.txt", "x"),
                sandbox.commands.run("echo ran"))
            assert executions[2].path == "/home/user/f.txt"
            return [executions[0].text, executions[1].text], executions[3].stdout
        finally:
            await sandbox.kill()

    texts, stdout = asyncio.run(main())
    assert texts == ["slow", "fast"] and stdout == "ran\n"  # all four answered, each in its turn


def test_kill_during_an_execution_ends_it(server: ServerHandle) -> None:
    marker = f"spin-{secrets.token_hex(4)}"

    async def main() -> tuple[object, float]:
        sandbox = await AsyncSandbox.create(timeout=60)
        execution = asyncio.create_task(sandbox.run_code(
            f"import ctypes\nctypes.CDLL(None).prctl(15, b'{marker}', 0, 0, 0)\nwhile True:\n    pass"))
        await wait_until_async(lambda: asyncio.to_thread(named, server, marker), 30, "the execution is running")
        killed_at = time.monotonic()
        await sandbox.kill()
        try:
            outcome: object = await asyncio.wait_for(execution, timeout=30)
        except Exception as exc:  # noqa: BLE001 - which error the SDK raises is what is checked below
            outcome = exc
        return outcome, time.monotonic() - killed_at

    outcome, waited = asyncio.run(main())
    assert waited < 10  # answered at once, never a hang
    if isinstance(outcome, Exception):
        assert isinstance(outcome, SandboxException), outcome
    else:
        assert outcome.error is not None and "killed" in outcome.error.value  # type: ignore[attr-defined]


def test_default_key_policy_and_sandbox_cap() -> None:
    """Without --e2b-api-key any non-empty key is accepted; past --e2b-max-sandboxes creation is 429."""
    handle = start_server("--slots", "2", "--preload", "", "--e2b-max-sandboxes", "2")
    try:
        opts = {"api_url": handle.url, "sandbox_url": handle.url}
        first = Sandbox.create(timeout=30, api_key="any-key-at-all", **opts)
        second = Sandbox.create(timeout=30, api_key="another-one", **opts)
        with pytest.raises(RateLimitException, match="max_sandboxes"):
            Sandbox.create(timeout=30, api_key="k", retries=0, **opts)
        first.kill()
        third = Sandbox.create(timeout=30, api_key="k", **opts)  # a place is free again
        assert third.run_code("1 + 1").text == "2"
        second.kill()
        third.kill()
        assert requests.get(handle.url + "/v2/sandboxes", headers={"X-API-Key": ""}, timeout=30).status_code == 401
    finally:
        stop_server(handle.process)


def test_fronts_route_every_call_to_the_front_holding_the_sandbox() -> None:
    """Under --fronts 2 a sandbox lives in one front; a call landing on the other is relayed there
    (control plane, /execute's stream, envd's files and its Connect command streams), lists merge."""
    handle = start_server("--slots", "4", "--preload", "", "--fronts", "2")
    url = handle.url
    try:
        ids: list[str] = []
        # A fresh connection each: the kernel hashes them over the fronts, so runs of one front happen.
        while len(ids) < 6 or {i.split("-", 1)[0] for i in ids} != {"f0", "f1"}:
            assert len(ids) < 48, f"48 connections all reached one front: {ids}"
            created = requests.post(f"{url}/v2/sandboxes", json={"templateID": "base", "timeout": 120,
                                                                "metadata": {"fronts": "yes"}},
                                    headers={"X-API-Key": "k", "Connection": "close"}, timeout=60)
            assert created.status_code == 201, created.text
            ids.append(created.json()["sandboxID"])
        for sandbox_id in ids:
            box = Sandbox.connect(sandbox_id, api_key="k", api_url=url, sandbox_url=url)
            assert box.run_code(f"print({sandbox_id!r})").logs.stdout == [f"{sandbox_id}\n"]
            box.files.write("/home/user/note.txt", sandbox_id)
            assert box.commands.run("cat note.txt").stdout == sandbox_id
        listed = Sandbox.list(api_key="k", api_url=url, query=_query({"fronts": "yes"})).next_items()
        assert sorted(s.sandbox_id for s in listed) == sorted(ids)
        for sandbox_id in ids:
            assert Sandbox.kill(sandbox_id, api_key="k", api_url=url) is True
        assert Sandbox.list(api_key="k", api_url=url).next_items() == []
    finally:
        stop_server(handle.process)


def test_a_client_that_gives_up_on_an_execution_is_no_server_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The SDK's own request timeout ends its wait; the execution finishes later and finds the
    client gone: a debug line, never an ERROR with a traceback, and the sandbox goes on."""
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log:
        handle = start_server("--slots", "2", "--preload", "", stderr=log)
    try:
        opts = {"api_url": handle.url, "sandbox_url": handle.url, "api_key": "a-key"}
        box = Sandbox.create(timeout=60, **opts)
        with pytest.raises(TimeoutException):
            box.run_code("import time\ntime.sleep(2)\nx = 1", timeout=0.5)
        # The execution ends (nothing in flight) and its answer meets the closed connection.
        wait_until(lambda: requests.get(f"{handle.url}/health", timeout=10).json()["in_flight"] == 0, 30,
                   "the abandoned execution has ended")
        assert box.run_code("x").text == "1"
        box.kill()
    finally:
        stop_server(handle.process)
    logged = log_path.read_text()
    assert "ERROR" not in logged and "Traceback" not in logged, logged[-3000:]


def test_an_execution_past_the_in_flight_cap_is_a_503_with_retry_after() -> None:
    """Admission answers E2B's routes through the error table: the status and Retry-After of an
    overloaded server, in E2B's body; the sandbox is served once there is room."""
    handle = start_server("--slots", "2", "--preload", "", "--max-in-flight", "1")
    try:
        opts = {"api_url": handle.url, "sandbox_url": handle.url, "api_key": API_KEY}
        busy, other = Sandbox.create(timeout=60, **opts), Sandbox.create(timeout=60, **opts)
        thread = threading.Thread(target=lambda: busy.run_code("import time; time.sleep(4)"))
        thread.start()
        wait_until(lambda: requests.get(handle.url + "/health", timeout=10).json()["in_flight"] >= 1, 30,
                   "the first execution is in flight")
        refused = requests.post(handle.url + "/execute", json={"code": "1"}, timeout=30,
                                headers={"E2b-Sandbox-Id": other.sandbox_id, "E2b-Sandbox-Port": "49999",
                                         "X-Access-Token": other._envd_access_token})
        thread.join()
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1", refused.text
        assert refused.json() == {"code": 503, "message": refused.json()["message"]}
        assert refused.json()["message"].startswith("server overloaded: 1 runs in flight")
        assert other.run_code("1 + 1").text == "2"
    finally:
        stop_server(handle.process)


def test_an_evicted_sandbox_says_it_was_evicted() -> None:
    """At the server's session cap the longest-idle session is evicted, which may be a sandbox's
    (docs/e2b.md, "Cap"): its owner's next call says why, not only that its session ended."""
    handle = start_server("--slots", "2", "--preload", "", "--max-sessions", "2")
    try:
        box = Sandbox.create(timeout=60, api_url=handle.url, sandbox_url=handle.url, api_key=API_KEY)
        for _ in range(2):
            assert requests.post(handle.url + "/sessions", json={"language": "python"}, timeout=60).status_code == 201
        with pytest.raises(SandboxException) as caught:
            box.run_code("1")
        assert "its session ended (evicted: the server's cap of 2 live sessions" in str(caught.value), caught.value
    finally:
        stop_server(handle.process)
