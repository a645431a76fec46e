"""Helpers of scripts/benchmark_tool_backends.py: scenarios, backends, the load loop, reports.

Kept out of `verl_sf` on purpose: nothing here is needed at run time by users of the package.
"""
