"""The verl tool where verl is not installed: it runs on its compatible base classes."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.server_fixtures import ServerHandle

WITHOUT_VERL = """
import asyncio, json, sys
sys.modules["verl"] = None  # as if verl were not installed: `import verl...` raises ImportError
from verl_sf.tools import SandboxFusionTool, VERL_AVAILABLE
from verl_sf.tools._compat import BaseTool, ToolResponse

async def main():
    tool = SandboxFusionTool({"sandbox_fusion_url": sys.argv[1], "print_last_expression": True}, None)
    instance_id, _ = await tool.create(ground_truth="42")
    response, reward, metrics = await tool.execute(instance_id, {"code": "6 * 7"})
    score = await tool.calc_reward(instance_id)
    assert tool.ground_truth(instance_id) == "42"
    await tool.release(instance_id)
    await tool.close()
    print(json.dumps({"verl": VERL_AVAILABLE, "base": BaseTool.__module__, "type": type(response).__module__,
                      "text": response.text, "reward": reward, "score": score, "backend": metrics["backend"],
                      "name": tool.name, "loaded": "verl" in sys.modules and sys.modules["verl"] is not None}))

asyncio.run(main())
"""


def test_works_without_verl_on_the_compatible_base(sf_server: ServerHandle) -> None:
    result = subprocess.run([sys.executable, "-c", WITHOUT_VERL, sf_server.run_code_url], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out == {"verl": False, "base": "verl_sf.tools._compat", "type": "verl_sf.tools._compat", "text": "42",
                   "reward": None, "score": 0.0, "backend": "http", "name": "code_interpreter", "loaded": False}
