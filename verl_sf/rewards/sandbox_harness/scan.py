"""The candidate's own output, as the trusted parent drains it: its tail is kept for the report, and a line shaped
like a verdict is flagged (the example harness read its verdict from stdout, so printing one was the hack)."""

from __future__ import annotations

import json
from collections.abc import Callable

OUTPUT_TAIL = 2000  # bytes of the candidate's own output kept for the report's detail
LINE_LIMIT = 65536  # longer output lines are not scanned for forged verdicts
_VERDICT_KEYS = ("results", "task_error", "report", "passed", "verdict", "score", "reward")


class _OutputScan:
    """Fed the output's chunks in order; flags through `suspect`, and stops parsing lines once `suspects` (the
    parent's own set) holds a forged verdict."""

    def __init__(self, suspects: set[str], suspect: Callable[[str, str], None]) -> None:
        self.suspects = suspects
        self.suspect = suspect
        self.tail = b""
        self.line = b""
        self.skipping_line = False

    def scan(self, chunk: bytes) -> None:
        """Keep the output's tail; flag lines shaped like a verdict."""
        self.tail = (self.tail + chunk)[-OUTPUT_TAIL:]
        *lines, rest = chunk.split(b"\n")
        for piece in lines:
            if not self.skipping_line:
                self.check_line(self.line + piece)
            self.line, self.skipping_line = b"", False
        if not self.skipping_line:
            self.line += rest
            if len(self.line) > LINE_LIMIT:
                self.line, self.skipping_line = b"", True

    def check_line(self, line: bytes) -> None:
        text = line.strip()
        if not text.startswith(b"{") or "forged_verdict" in self.suspects:
            return
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            import ast

            try:
                value = ast.literal_eval(text.decode("utf-8", "replace"))
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return
        if type(value) is dict and any(key in value for key in _VERDICT_KEYS):
            self.suspect("forged_verdict", f"printed a verdict-like line: {text[:120].decode('utf-8', 'replace')}")

    def last_line(self) -> str:
        """`: <the output's last line>`, or nothing when the candidate printed nothing."""
        lines = self.tail.decode("utf-8", "replace").strip().splitlines()
        return f": {lines[-1][:300]}" if lines else ""
