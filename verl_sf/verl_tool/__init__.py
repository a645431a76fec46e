"""verl-tool's tool-server protocol (`POST /get_observation`) for its `python_code` tool.

This package is the tool (protocol, parsing, trajectory state) and knows nothing of HTTP: the
server installs the route (`verl_sf.server.verl_tool_routes`).
"""

from verl_sf.verl_tool.config import VerlToolConfig, VerlToolState

__all__ = ["VerlToolConfig", "VerlToolState"]
