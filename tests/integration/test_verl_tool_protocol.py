"""verl-tool's tool-server protocol (POST /get_observation) against real `verl-sf serve` processes.

Every test that does not depend on one state mode runs in both: `session` (the default, so the
shared default server) and `replay` (a server started with `--verl-tool-state replay`).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.reference_python import python_main_py
from tests.server_fixtures import SERVER_SECRET, ServerHandle, run_code, start_server, stop_server
from tests.waiting import wait_until

# verl-tool's servers/tests/test_python_code_tool.py actions, as it sends them.
HELLO = "<python>print('Hello from Python!')</python> ..."
HELLO_ARGS = ("<python>import sys\n\nprint('Hello from Python!')\nprint(f'Arguments: {sys.argv[1:]}')\n"
              "for i in range(5):\n    print(f'Number {i}')</python> ...")
FENCED = "```python\nprint('Hello from Python!')\n``` ..."
SEVERAL_BLOCKS = "```<python>\nprint('Hello from Python!')</python> ... <python>print('Hello again!')</python>``` ..."
SLEEP = ("```<python>import time\ntime.sleep(30)\nprint('Hello from Python!')</python> ... "
         "<python>print('Hello again!')</python>``` ...")
SYNTAX_ERROR = "```<python>prnit('Hello from Python!')</python> ..."
RAISES = "```python\nraise ValueError('This is a test error')\n``` ..."
ALLOCATION = ("```<python>\nimport numpy as np\nx = np.random.rand({n}, {n})\nsize_of_x_in_bytes = x.nbytes\n"
              "print(f'Memory test completed after allocating a {{len(x)}}x{{len(x[0])}} array, which is "
              "{{size_of_x_in_bytes / (1024 * 1024):.2f}} MB.')</python> ...```")
BIG_PRINT = "<python>print('x' * (68 * 1024))</python>"



def result(text: str) -> str:
    """An observation as verl-tool's python_code marks up the output of a `<python>` action."""
    return f"\n<result>\n{text}\n</result>\n"


def observe(server: ServerHandle, trajectory_ids: list[str], actions: list[str], **fields: Any) -> dict[str, Any]:
    response = requests.post(server.url + "/get_observation",
                             json={"trajectory_ids": trajectory_ids, "actions": actions, **fields}, timeout=600)
    assert response.status_code == 200, response.text
    body = response.json()
    assert len(body["observations"]) == len(body["dones"]) == len(body["valids"]) == len(trajectory_ids)
    return body


def turn(server: ServerHandle, trajectory_id: str, action: str, **fields: Any) -> str:
    """One valid, not-done turn of one trajectory; its observation text."""
    body = observe(server, [trajectory_id], [action], **fields)
    assert body["valids"] == [True] and body["dones"] == [False], body
    return body["observations"][0]


def finish(server: ServerHandle, trajectory_ids: list[str]) -> None:
    """End trajectories as verl-tool's agent loop closes them (their sessions would otherwise idle on)."""
    count = len(trajectory_ids)
    body = observe(server, trajectory_ids, [""] * count, finish=[True] * count, is_last_step=[True] * count)
    assert body["observations"] == [""] * count and body["dones"] == [True] * count
    assert body["valids"] == [True] * count


def new_ids(count: int = 1) -> list[str]:
    prefix = uuid.uuid4().hex[:8]
    return [f"{prefix}-{index}" for index in range(count)]


@pytest.fixture(scope="module")
def replay_server() -> Iterator[ServerHandle]:
    handle = start_server("--verl-tool-state", "replay", env={**os.environ, "VERL_SF_TEST_SECRET": SERVER_SECRET})
    yield handle
    stop_server(handle.process)


@pytest.fixture(params=["session", "replay"])
def server(request: pytest.FixtureRequest) -> ServerHandle:
    return request.getfixturevalue("sf_server" if request.param == "session" else "replay_server")


def test_verl_tools_own_example_actions(server: ServerHandle, request: pytest.FixtureRequest) -> None:
    actions = [HELLO, HELLO_ARGS, FENCED, SEVERAL_BLOCKS, SLEEP, SYNTAX_ERROR, RAISES,
               ALLOCATION.format(n=5000), BIG_PRINT, ALLOCATION.format(n=40000)]
    ids = new_ids(len(actions))
    body = observe(server, ids, actions)  # one batch: the entries run side by side
    assert body["valids"][:-1] == [True] * 9 and body["dones"][:-1] == [False] * 9
    hello, args, fenced, several, sleep, syntax, raises, small, big_print, huge = body["observations"]
    assert hello == result("Hello from Python!")
    assert args == result("Hello from Python!\nArguments: []\nNumber 0\nNumber 1\nNumber 2\nNumber 3\nNumber 4")
    assert fenced == "\n```result\nHello from Python!\n```\n"
    assert several == result("Hello from Python!\nHello again!")  # verl-tool's docs show this very answer
    assert sleep == result("Execution timed out after 10 seconds.")
    # A session runs the pre-imports as a call of their own; replay puts them on a line before the turn's code.
    line = 1 if request.node.callspec.params["server"] == "session" else 2
    assert syntax.startswith(f'\n<result>\nTraceback (most recent call last):\n  File "main.py", line {line}, in <module>')
    assert syntax.endswith("NameError: name 'prnit' is not defined. Did you mean: 'print'?\n</result>\n")
    assert "/workdir" not in syntax
    assert raises.endswith("ValueError: This is a test error\n```\n")
    assert small == result("Memory test completed after allocating a 5000x5000 array, which is 190.73 MB.")
    assert big_print == result("x" * (68 * 1024))
    assert_killed_for_memory(huge, body["valids"][-1], body["dones"][-1])
    finish(server, ids)


def assert_killed_for_memory(observation: Any, valid: bool, done: bool) -> None:
    """Filling 2 GB takes seconds of CPU: on a machine busy enough that the run mostly waits for a CPU
    and times out, that is the sandbox's failure (never the code's); otherwise the memory cap's verdict."""
    if not valid:
        assert done and observation["obs"] == "" and "sandbox error" in observation["error"], observation
        assert "waited for a CPU" in observation["error"]
        return
    assert not done and "Memory test completed" not in observation, observation
    assert "MemoryError" in observation or "memory limit" in observation, observation


def test_an_action_without_code_is_not_valid(server: ServerHandle) -> None:
    body = observe(server, new_ids(2), ["I think the answer is 42.", "```bash\nls\n```"])
    assert body["valids"] == [False, False] and body["dones"] == [False, False]
    for observation in body["observations"]:
        assert observation["obs"] == "" and observation["invalid_reason"] == "No valid tool found for action"


def test_three_turns_use_earlier_variables(server: ServerHandle) -> None:
    [trajectory] = new_ids()
    # As verl-tool's agent loop sends a turn: the dataset's extra_info as extra_fields, finish and is_last_step beside.
    agent_loop_fields = {"extra_fields": [{"index": 7, "split": "train", "question": "What is x?"}],
                         "finish": [False], "is_last_step": [False]}
    assert turn(server, trajectory, "<python>x = 10\nprint(f'Value of x is {x}')</python>", **agent_loop_fields) == \
        result("Value of x is 10")
    second = "Now a function.\n```python\ndef scale(y):\n    return x * y\nprint(scale(2))\n```\n```output"
    assert turn(server, trajectory, second) == "\n20\n```\n"  # earlier turns' output is not repeated
    third = "<python>x = scale(x) + 1\nprint(x)\nraise ValueError('after the print')</python>"
    observation = turn(server, trajectory, third)
    assert observation.startswith("\n<result>\n101\n\nTraceback") and "ValueError: after the print" in observation
    assert turn(server, trajectory, "<python>print(x, scale(1))</python>") == result("101 101")
    finish(server, [trajectory])


def test_stdin_from_extra_fields_and_from_an_input_block(server: ServerHandle) -> None:
    ids = new_ids(2)
    body = observe(server, ids, ["<python>print(input()[::-1])</python>",
                                 "```python\nprint(int(input()) * 2)\n```\n```input\n21\n```"],
                   extra_fields=[{"stdin": "olleh\n"}, {"stdin": "ignored"}])
    assert body["observations"] == [result("hello"), "\n```result\n42\n```\n"]
    finish(server, ids)


def test_256_trajectories_in_one_batch(server: ServerHandle, request: pytest.FixtureRequest) -> None:
    def live_sessions() -> int:
        return requests.get(server.url + "/health", timeout=30).json()["sessions"]

    before = live_sessions()
    ids = new_ids(256)
    first = observe(server, ids, [f"<python>n = {index}\nprint(n * n)</python>" for index in range(256)])
    assert first["observations"] == [result(str(index * index)) for index in range(256)]
    assert first["valids"] == [True] * 256 and first["dones"] == [False] * 256
    opened = 256 if request.node.callspec.params["server"] == "session" else 0  # replay keeps no sessions
    assert live_sessions() == before + opened
    second = observe(server, ids, ["<python>print(n + 1)</python>"] * 256)
    assert second["observations"] == [result(str(index + 1)) for index in range(256)]
    finish(server, ids)
    assert live_sessions() == before


def test_the_finish_signal_ends_the_trajectorys_state(server: ServerHandle) -> None:
    top_level, in_extra_fields, last_step = new_ids(3)
    observe(server, [top_level, in_extra_fields, last_step], ["<python>secret = 7</python>"] * 3)
    # verl-tool's agent loop: `finish` beside the actions; its server also reads it from extra_fields.
    body = observe(server, [top_level, in_extra_fields], ["", "<python>print('not run')</python>"],
                   finish=[True, False], extra_fields=[{}, {"finish": True}])
    assert body == {**body, "observations": ["", ""], "dones": [True, True], "valids": [True, True]}
    # The last step's action still runs; the state goes after it.
    assert turn(server, last_step, "<python>print(secret)</python>", is_last_step=[True]) == result("7")
    for trajectory in (top_level, in_extra_fields, last_step):
        observation = turn(server, trajectory, "<python>print(secret)</python>")
        assert observation.endswith("NameError: name 'secret' is not defined\n</result>\n"), observation
        assert "state is gone" not in observation  # a finished trajectory is simply new again
    finish(server, [top_level, in_extra_fields, last_step])


def test_one_trajectorys_turns_in_one_batch_run_in_order(server: ServerHandle) -> None:
    [trajectory] = new_ids()
    body = observe(server, [trajectory] * 4, ["<python>v = 1\nprint(v)</python>", "<python>v += 1\nprint(v)</python>",
                                              "", "<python>print('v' in globals())</python>"],
                   finish=[False, False, True, False])
    assert body["observations"] == [result("1"), result("2"), "", result("False")]
    finish(server, [trajectory])


def test_hostile_code_is_contained_as_through_run_code(server: ServerHandle) -> None:
    port = int(server.url.rsplit(":", 1)[1])
    probes = {
        "shadow": "try:\n    open('/etc/shadow').read()\n    print('READ')\nexcept OSError as exc:\n"
                  "    print('blocked', type(exc).__name__)",
        "network": f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                   f"    print('CONNECTED')\nexcept OSError as exc:\n    print('blocked', type(exc).__name__)",
        "environment": "import os\nprint('secret', os.environ.get('VERL_SF_TEST_SECRET'))",
        "server files": f"import os\nprint('visible', os.path.exists({os.path.abspath(__file__)!r}))",
    }
    ids = new_ids(len(probes))
    body = observe(server, ids, [f"<python>{code}</python>" for code in probes.values()])
    for (name, code), observation in zip(probes.items(), body["observations"], strict=True):
        direct = run_code(server, code)["run_result"]["stdout"].strip()
        assert observation == result(direct), name
        assert direct.split()[0] in {"blocked", "secret", "visible"} and direct.split()[-1] != "True", name
        assert "READ" not in direct and "CONNECTED" not in direct and SERVER_SECRET not in direct
    assert body["valids"] == [True] * len(probes)
    finish(server, ids)


def test_a_fork_bomb_is_contained_as_through_run_code(server: ServerHandle) -> None:
    code = ("import os\ncount = 0\nfor _ in range(100000):\n    try:\n        if os.fork() == 0:\n"
            "            import time; time.sleep(60); os._exit(0)\n        count += 1\n"
            "    except OSError:\n        break\nprint('forked', count)")
    [trajectory] = new_ids()
    observation = turn(server, trajectory, f"<python>{code}</python>")
    finish(server, [trajectory])
    direct = run_code(server, code)["run_result"]["stdout"].split()
    forked = observation.split("forked ")[1].split()[0]
    assert direct[0] == "forked" and int(direct[1]) < 300 and int(forked) < 300  # the per-run process cap
    assert requests.get(server.url + "/v1/ping", timeout=30).json() == "pong"


def test_malformed_bodies_get_422_naming_the_field(server: ServerHandle) -> None:
    url = server.url + "/get_observation"
    cases = [({"actions": ["x"]}, "trajectory_ids"), ({"trajectory_ids": ["a", "b"], "actions": ["x"]}, "actions"),
             ({"trajectory_ids": ["a"], "actions": ["x"], "finish": [True, True]}, "finish"),
             ({"trajectory_ids": ["a"], "actions": ["x"], "extra_fields": [{"stdin": 1}]}, "extra_fields")]
    for body, field in cases:
        response = requests.post(url, json=body, timeout=30)
        assert response.status_code == 422, response.text
        assert response.json()["detail"][0]["loc"] == ["body", field]
    assert requests.post(url, data=b"{not json", timeout=30).status_code == 400
    assert requests.post(url, json=["a"], timeout=30).status_code == 422
    [trajectory] = new_ids()
    assert turn(server, trajectory, HELLO) == result("Hello from Python!")  # still serving
    finish(server, [trajectory])


@pytest.fixture(params=["session", "replay"], scope="module")
def short_ttl_server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    """A 1 s idle TTL and a 256 MB memory cap per run."""
    handle = start_server("--verl-tool-state", request.param, "--verl-tool-idle-ttl", "1", "--slots", "1",
                          "--default-memory-mb", "256", "--preload", "")
    yield handle
    stop_server(handle.process)


def test_an_idle_trajectory_loses_its_state_and_is_told(short_ttl_server: ServerHandle) -> None:
    [trajectory] = new_ids()
    assert turn(short_ttl_server, trajectory, "<python>kept = 1\nprint(kept)</python>") == result("1")
    # Idle past the 1 s TTL: time must pass (a trajectory's TTL is checked at its next turn: no state to poll).
    time.sleep(3)
    observation = turn(short_ttl_server, trajectory, "<python>print(kept)</python>")
    assert observation.startswith("\n<result>\n[verl-sf: earlier turns' state is gone"), observation
    assert observation.endswith("NameError: name 'kept' is not defined\n</result>\n")
    assert turn(short_ttl_server, trajectory, "<python>kept = 2</python>") == result("")
    assert turn(short_ttl_server, trajectory, "<python>print(kept)</python>") == result("2")
    finish(short_ttl_server, [trajectory])


def test_a_turn_killed_for_memory(short_ttl_server: ServerHandle, request: pytest.FixtureRequest) -> None:
    [trajectory] = new_ids()
    assert turn(short_ttl_server, trajectory, "<python>kept = 1</python>") == result("")
    killed = turn(short_ttl_server, trajectory, "<python>print('filling')\nblock = bytearray(512 << 20)</python>")
    memory = "[verl-sf: killed: memory limit of 256 MB exceeded]"
    after = turn(short_ttl_server, trajectory, "<python>print('kept' in globals())</python>")
    if request.node.callspec.params["short_ttl_server"] == "session":
        assert killed == result(f"filling\n\n\n{memory}\n[verl-sf: the interpreter ended (killed for exceeding its "
                                "memory limit); the next turn starts from a clean state]")
        assert after == result("False")
    else:  # verl-tool's replay: every later turn re-runs the allocation first, and dies of it too
        assert killed == result(f"filling\n\n\n{memory}")
        assert after == result(memory)
    finish(short_ttl_server, [trajectory])


@pytest.fixture(scope="module")
def tiny_server() -> Iterator[ServerHandle]:
    """Room for two runs in flight (running or waiting for the one CPU slot)."""
    handle = start_server("--verl-tool-state", "replay", "--slots", "1", "--max-in-flight", "2", "--preload", "")
    yield handle
    stop_server(handle.process)


def test_a_batch_past_the_in_flight_cap_gets_overloaded_entries_not_a_failed_batch(tiny_server: ServerHandle) -> None:
    actions = ["<python>import time\ntime.sleep(3)\nprint('ran')</python>"] * 3
    body = observe(tiny_server, new_ids(3), actions)
    ran = [observation == result("ran") for observation in body["observations"]]
    assert ran == [True, True, False]  # two in flight, the third refused
    refused = body["observations"][2]
    assert refused["obs"] == "" and "server overloaded" in refused["error"]
    assert body["valids"] == [True, True, False] and body["dones"] == [False, False, True]
    metrics = requests.get(tiny_server.url + "/metrics", timeout=30).text
    assert 'verl_sf_runs_total{endpoint="get_observation",language="python",status="Success"} 2.0' in metrics
    assert 'verl_sf_rejections_total{reason="overloaded"} 1.0' in metrics


def test_a_batch_that_could_not_run_at_all_gets_503(tiny_server: ServerHandle) -> None:
    blocking: dict[str, Any] = {}
    actions = ["<python>import time\ntime.sleep(3)\nprint('ran')</python>"] * 2
    thread = threading.Thread(target=lambda: blocking.update(observe(tiny_server, new_ids(2), actions)))
    thread.start()
    wait_until(lambda: requests.get(tiny_server.url + "/health", timeout=30).json()["in_flight"] >= 2, 60,
               "the blocking batch fills the in-flight cap")
    response = requests.post(tiny_server.url + "/get_observation", timeout=60,
                             json={"trajectory_ids": new_ids(), "actions": [HELLO]})
    thread.join()
    assert response.status_code == 503 and response.headers["Retry-After"] == "1"
    assert "server overloaded" in response.json()["detail"]
    assert blocking["observations"] == [result("ran")] * 2


# ---- session mode only ---------------------------------------------------------------------------------

def test_a_turn_interrupted_at_its_time_out_keeps_the_trajectorys_state(sf_server: ServerHandle) -> None:
    [trajectory] = new_ids()
    assert turn(sf_server, trajectory, "<python>kept = 'still here'</python>") == result("")
    interrupted = turn(sf_server, trajectory, "<python>import time\nprint('started')\ntime.sleep(30)</python>")
    assert interrupted == result("started\n\nExecution timed out after 10 seconds.")  # no KeyboardInterrupt traceback
    assert turn(sf_server, trajectory, "<python>print(kept)</python>") == result("still here")
    finish(sf_server, [trajectory])


def test_a_turn_that_ignores_the_interrupt_ends_the_state_and_says_so(sf_server: ServerHandle) -> None:
    [trajectory] = new_ids()
    assert turn(sf_server, trajectory, "<python>kept = 1</python>") == result("")
    stubborn = ("<python>import time\nwhile True:\n    try:\n        time.sleep(30)\n"
                "    except KeyboardInterrupt:\n        pass</python>")
    observation = turn(sf_server, trajectory, stubborn)
    # Asleep again after catching it: no CPU spent, nothing in /proc that says why, so the client's deadline ends it.
    head, _, tail = observation.partition("state S (sleeping), waiting in hrtimer_nanosleep")
    assert head.startswith("\n<result>\nExecution timed out after 10 seconds.\n[verl-sf: the interpreter ended (killed: "
                           "the call had not stopped on the interrupt at its time-out when the client's deadline "
                           "came"), observation
    assert "the code did not stop on the interrupt (it caught KeyboardInterrupt" in head, observation
    assert tail.endswith("the next turn starts from a clean state]\n</result>\n"), observation
    fresh = turn(sf_server, trajectory, "<python>print('kept' in globals(), sqrt(16))</python>")
    assert fresh == result("False 4.0")  # a new interpreter, with verl-tool's pre-imports again
    finish(sf_server, [trajectory])


def test_a_turn_whose_client_gave_up_still_runs_before_the_next(sf_server: ServerHandle) -> None:
    """verl-tool's client may time out and move on: the abandoned turn ends, then the next one runs."""
    [trajectory] = new_ids()
    assert turn(sf_server, trajectory, "<python>x = 1</python>") == result("")
    with pytest.raises(requests.Timeout):
        requests.post(sf_server.url + "/get_observation", timeout=0.5, json={
            "trajectory_ids": [trajectory], "actions": ["<python>import time\ntime.sleep(2)\nx = 2</python>"]})
    assert turn(sf_server, trajectory, "<python>print(x)</python>") == result("2")
    finish(sf_server, [trajectory])


def test_session_tracebacks_keep_the_turns_own_line_numbers(sf_server: ServerHandle) -> None:
    [trajectory] = new_ids()
    for code in ("x = 1\ny = x +\n", "values = []\n\nvalues[3]", "def f():\n    return no_such_name\nf()"):
        observation = turn(sf_server, trajectory, f"<python>{code}</python>")
        assert observation == result(python_main_py(code, "")[1].strip()), observation
    finish(sf_server, [trajectory])

