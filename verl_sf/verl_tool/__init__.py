"""verl-tool's tool-server protocol (`POST /get_observation`) for its `python_code` tool.

Only the configuration is imported here: the server module imports it, and the routes
(`verl_sf.verl_tool.routes`) import the server's request helpers in turn.
"""

from verl_sf.verl_tool.config import VerlToolConfig, VerlToolState

__all__ = ["VerlToolConfig", "VerlToolState"]
