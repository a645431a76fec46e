"""A process that used the verl tool exits quietly: no aiohttp "Unclosed ..." warning at exit.

verl never calls the tool's `close()`, and each `asyncio.run` (a script, a test) leaves its
connections behind on a closed loop; what is left must still be closed when the process exits.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.server_fixtures import ServerHandle

SCRIPT = textwrap.dedent("""
    import asyncio, sys
    from verl_sf.tools import SandboxFusionTool

    tool = SandboxFusionTool({"sandbox_fusion_url": sys.argv[1], "pool": "inprocess"})

    async def call(code):
        instance, _ = await tool.create()
        response, _, _ = await tool.execute(instance, {"code": code})
        await tool.release(instance)
        return response.text

    print(asyncio.run(call("print(6 * 7)")))  # one loop, closed with its connections still open
    print(asyncio.run(call("print(6 * 8)")))  # and a second one, as a second script step would
""")


def test_no_unclosed_warnings_at_exit(sf_server: ServerHandle) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, sf_server.run_code_url], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == ["42", "48"], done.stdout  # after the schema verl's BaseTool prints
    assert "Unclosed" not in done.stderr, done.stderr
