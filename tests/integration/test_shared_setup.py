"""A row's set-up (`tools_kwargs.code_interpreter.create_kwargs.setup`) run once for its group of trajectories.

Driven by verl 0.9's own ToolAgentLoop (and by `verl-sf rollout`) against a real server; the only stand-in is the language
model (a scripted policy).  How often a set-up ran is counted three honest ways: the server's own
run counter (`verl_sf_runs_total`), the snapshot's `sessions_started`, and a random token the
set-up draws from os.urandom, which every trajectory prints (n set-up runs would draw n tokens).
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import requests

from tests.ray_fixtures import RayCluster
from tests.rollout_helpers import run_cli
from tests.server_fixtures import ServerHandle, runs_finished, start_server, stop_server
from tests.special_e2e.policy_server import Call, PolicyServer, Script, Turn
from tests.verl_harness import VerlHarness, agent_data, build_loop, tool_call, write_tool_config
from tests.waiting import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="module")]
INPROCESS = {"pool": "inprocess"}
SETUP_CODE = ("import os\ntoken = os.urandom(8).hex()\nwith open('ran.txt', 'a') as f:\n    f.write('ran')\n"
              "rows = open('data.csv').read().splitlines()\n")
DATA = base64.b64encode(b"a,b\n1,2\n3,4\n").decode()
REPORT = "print(token, open('ran.txt').read(), len(rows))"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerHandle]:
    handle = start_server("--slots", "2", "--preload", "", "--list-snapshots")
    yield handle
    stop_server(handle.process)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def harness(tmp_path_factory: pytest.TempPathFactory, server: ServerHandle) -> AsyncIterator[VerlHarness]:
    tool = VerlHarness(write_tool_config(tmp_path_factory.mktemp("tool"), session="trajectory", **INPROCESS,
                                         sandbox_fusion_url=server.run_code_url, default_timeout=10))
    yield tool
    await tool.close()


def setup_kwargs(code: str = SETUP_CODE, **extra: Any) -> dict[str, Any]:
    """A row's tools_kwargs, as verl's RLHFDataset hands them to the agent loop (`extra_info.tools_kwargs`)."""
    return {"code_interpreter": {"create_kwargs": {"setup": {"code": code, "files": {"data.csv": DATA}, **extra}}}}


def snapshots(server: ServerHandle) -> dict[str, dict[str, Any]]:
    listed = requests.get(server.url + "/snapshots", timeout=30).json()["snapshots"]
    return {s["snapshot_id"]: s for s in listed}


async def group(harness: VerlHarness, code: str, tools_kwargs: dict[str, Any], n: int) -> list[tuple[str, dict]]:
    """`n` trajectories of one row making their first call at once: (text, metrics) each."""
    answers = await asyncio.gather(*(harness.loop._call_tool(tool_call(code), tools_kwargs, agent_data())
                                     for _ in range(n)))
    return [(response.text, metrics) for response, _, metrics in answers]


async def test_a_group_runs_its_setup_once_through_the_agent_loop(harness: VerlHarness,
                                                                  server: ServerHandle) -> None:
    """Four trajectories of one row, each verl's whole ToolAgentLoop.run with the row's tools_kwargs."""

    def call(code: str) -> str:
        return "<tool_call>" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}}) + "</tool_call>"

    runs_before, snapshots_before = runs_finished(server), set(snapshots(server))
    loops = [build_loop(harness.cfg, [harness.tool], [call(REPORT), call("rows.append('mine')\nprint(len(rows))"),
                                                      "Done."]) for _ in range(4)]
    await asyncio.gather(*(loop.run({"temperature": 1.0}, raw_prompt=[{"role": "user", "content": "Analyse"}],
                                    tools_kwargs=setup_kwargs()) for loop, _ in loops))
    reports = [policy.prompts[-1] for _, policy in loops]
    tokens = set()
    for prompt in reports:
        first, second = prompt.split("<tool_response>\n")[1:3]
        token, ran, count = first.split("\n")[0].split()
        tokens.add(token)
        assert (ran, count) == ("ran", "3"), "the set-up ran once in this session's past, and its files are there"
        assert second.startswith("4\n"), "each trajectory's writes are its own"
    assert len(tokens) == 1, f"every trajectory starts from the same set-up run, got {tokens}"
    new = {k: v for k, v in snapshots(server).items() if k not in snapshots_before}
    assert [s["sessions_started"] for s in new.values()] == [4], new
    assert runs_finished(server) - runs_before == 1 + 4 * 2, "one set-up run, then each trajectory's two calls"


async def test_a_later_trajectory_of_the_same_setup_reuses_its_snapshot(harness: VerlHarness,
                                                                         server: ServerHandle) -> None:
    kwargs = setup_kwargs(SETUP_CODE + "kind = 'reused'\n")
    [(first, _)] = await group(harness, REPORT, kwargs, 1)
    runs_before = runs_finished(server)
    [(later, _)] = await group(harness, REPORT, kwargs, 1)
    assert later == first and first.endswith(" ran 3")
    assert runs_finished(server) - runs_before == 1, "only the call ran: the set-up was not run again"
    other = setup_kwargs(SETUP_CODE + "kind = 'other'\n")
    [(different, _)] = await group(harness, REPORT, other, 1)
    assert different.split()[0] != first.split()[0], "a set-up of other content is run on its own"


async def test_a_failed_setup_is_each_trajectorys_error_and_is_tried_again(harness: VerlHarness,
                                                                             server: ServerHandle) -> None:
    failing = setup_kwargs("rows = 1 / 0\n")
    runs_before, snapshots_before = runs_finished(server), set(snapshots(server))
    answers = await group(harness, "print('never')", failing, 3)
    for text, metrics in answers:
        assert text.startswith("Set-up error:") and "ZeroDivisionError" in text and "did not run" in text, text
        assert metrics["status"] == "setup_failed"
    assert runs_finished(server) - runs_before == 1, "the three waited for one set-up run"
    assert set(snapshots(server)) == snapshots_before, "a failed set-up leaves no snapshot"
    [(again, _)] = await group(harness, "print('never')", failing, 1)
    assert "ZeroDivisionError" in again
    assert runs_finished(server) - runs_before == 2, "a failure is not kept as the set-up's answer: it runs again"


async def test_a_snapshot_the_server_lost_is_built_again_once(harness: VerlHarness, server: ServerHandle) -> None:
    kwargs = setup_kwargs(SETUP_CODE + "kind = 'lost'\n")
    before = set(snapshots(server))
    [(first, _)] = await group(harness, REPORT, kwargs, 1)
    [lost] = set(snapshots(server)) - before
    assert requests.delete(f"{server.url}/snapshots/{lost}", timeout=30).status_code == 200
    runs_before = runs_finished(server)
    [(rebuilt, _)] = await group(harness, REPORT, kwargs, 1)
    assert rebuilt.endswith(" ran 3") and rebuilt.split()[0] != first.split()[0], "a new set-up run, a new token"
    assert runs_finished(server) - runs_before == 2, "the set-up ran again, then the call"
    assert len(set(snapshots(server)) - before) == 1


async def test_bad_setups_are_refused_naming_the_problem(harness: VerlHarness, tmp_path: Path,
                                                         server: ServerHandle) -> None:
    bad = {"code_interpreter": {"create_kwargs": {"setup": {"code": "x = 1", "files": {"../escape": DATA}}}}}
    [(text, _)] = await group(harness, "print(1)", bad, 1)
    assert "setup.files" in text and ".." in text, text
    empty = {"code_interpreter": {"create_kwargs": {"setup": {"language": "bash"}}}}
    [(text, _)] = await group(harness, "print(1)", empty, 1)
    assert "needs `code`, `files` or both" in text, text
    stateless = VerlHarness(write_tool_config(tmp_path, sandbox_fusion_url=server.run_code_url, **INPROCESS))
    try:
        [(text, _)] = await group(stateless, "print(1)", setup_kwargs(), 1)
        assert "session: trajectory" in text, text
    finally:
        await stateless.close()


async def test_bash_setups_and_a_cap_on_kept_snapshots(tmp_path: Path, server: ServerHandle) -> None:
    """With `max_setup_snapshots: 1` a second set-up's snapshot replaces the first's at the server."""
    capped = VerlHarness(write_tool_config(tmp_path, session="trajectory", max_setup_snapshots=1, **INPROCESS,
                                           sandbox_fusion_url=server.run_code_url))
    before = set(snapshots(server))
    try:
        first = {"code_interpreter": {"create_kwargs": {"setup": {"language": "bash",
                                                                  "code": "export STAGE=one; cd /tmp"}}}}
        trajectories = [agent_data() for _ in range(2)]
        answers = await asyncio.gather(*(capped.loop._call_tool(tool_call("echo $STAGE $PWD", language="bash"),
                                                                first, data) for data in trajectories))
        assert [response.text for response, _, _ in answers] == ["one /tmp"] * 2
        [first_snapshot] = set(snapshots(server)) - before
        second = setup_kwargs(SETUP_CODE + "kind = 'capped'\n")
        await group(capped, REPORT, second, 1)
        wait_until(lambda: first_snapshot not in snapshots(server), 10, "the least recently used snapshot is deleted")
        assert len(set(snapshots(server)) - before) == 1
        runs_before = runs_finished(server)
        later, _, _ = await capped.loop._call_tool(tool_call("export STAGE=two; echo $PWD", language="bash"), first,
                                                   trajectories[0])
        assert later.text == "/tmp" and runs_finished(server) - runs_before == 1, \
            "a trajectory already set up goes on in its session: its evicted snapshot is not built again"
    finally:
        await capped.close()
    assert set(snapshots(server)) <= before, "closing the tool deletes its set-ups' snapshots"


# ---- verl-sf rollout: the driver passes each sample's tools_kwargs the same way ------------------
async def test_the_rollout_driver_runs_each_rows_setup_once_per_group(tmp_path: Path, server: ServerHandle) -> None:
    rows = []
    for prompt, answer in (("Q-first", 42), ("Q-second", 7)):
        setup = {"code": f"answer = {answer}\n", "files": {"data.csv": DATA}}
        rows.append({"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": prompt}],
                     "reward_model": {"ground_truth": str(answer)},
                     "extra_info": {"tools_kwargs": {"code_interpreter": {"create_kwargs": {"setup": setup}}}}})
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tools = write_tool_config(tmp_path, sandbox_fusion_url=server.run_code_url, session="trajectory", **INPROCESS)
    call = Call("code_interpreter", json.dumps({"code": "print(answer)"}))
    scripts = {prompt: Script([Turn("", [call]), Turn("So #### {tool}")]) for prompt in ("Q-first", "Q-second")}
    runs_before, snapshots_before = runs_finished(server), set(snapshots(server))
    async with PolicyServer(scripts) as policy:
        code, stdout, stderr = await run_cli("--server", policy.url, "--data", str(data), "--tool-config", tools,
                                             "--n", "3", "--no-progress")
    assert code == 0, stderr
    assert "accuracy: 1.0000" in stdout, "every trajectory started from its own row's set-up"
    assert runs_finished(server) - runs_before == 2 + 2 * 3, "one set-up run per row, then each trajectory's call"
    assert set(snapshots(server)) <= snapshots_before, "the driver closed its tools, which deleted the snapshots"


@pytest.mark.ray
async def test_setups_through_the_ray_actor_pool(tmp_path: Path, server: ServerHandle, ray_local: RayCluster) -> None:
    """With `pool: ray_actor` the set-up runs inside the pool actor: its snapshot, and its failures
    (SetupFailed, SnapshotGone), cross Ray intact."""
    actor = VerlHarness(write_tool_config(tmp_path, sandbox_fusion_url=server.run_code_url, session="trajectory",
                                          pool="ray_actor"))
    try:
        kwargs = setup_kwargs(SETUP_CODE + "kind = 'actor'\n")
        before, runs_before = set(snapshots(server)), runs_finished(server)
        answers = await group(actor, REPORT, kwargs, 3)
        assert len({text for text, _ in answers}) == 1 and answers[0][0].endswith(" ran 3"), answers
        assert runs_finished(server) - runs_before == 1 + 3
        [made] = set(snapshots(server)) - before
        assert requests.delete(f"{server.url}/snapshots/{made}", timeout=30).status_code == 200
        [(rebuilt, _)] = await group(actor, REPORT, kwargs, 1)
        assert rebuilt.endswith(" ran 3") and rebuilt != answers[0][0], "lost, so built again: a new token"
        [(failed, metrics)] = await group(actor, "print(1)", setup_kwargs("import nonexistent_module\n"), 1)
        assert failed.startswith("Set-up error:") and "ModuleNotFoundError" in failed, failed
        assert metrics["status"] == "setup_failed"
    finally:
        await actor.close()
    assert set(snapshots(server)) <= before, "closing the tool deleted its snapshots from inside the actor"
