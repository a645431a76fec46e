"""Competition-math answers in `\\boxed{...}` (the ReTool / DAPO / MATH convention).

The last boxed expression is compared with the ground truth by exact value when both are
numbers (so `\\frac{1}{2}`, `1/2` and `0.5` agree) and otherwise as normalised LaTeX strings.
No symbolic algebra: graders stay fast and deterministic inside a rollout loop.
"""

from __future__ import annotations

import re
from typing import Optional

from verl_sf.rewards.numbers import parse_number

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> Optional[str]:
    """Contents of the last `\\boxed{...}` (braces balanced) or `\\boxed x`, or None."""
    start, cmd = max((text.rfind(cmd), cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    rest = text[start + len(cmd):]
    body = rest.lstrip()
    if not body.startswith("{"):
        # `\boxed 5`: the argument is the next token (up to whitespace or a closing '$').
        token = re.split(r"[\s$]", body, maxsplit=1)[0] if rest[:1].isspace() else ""
        return token or None
    rest = body
    depth = 0
    for i, ch in enumerate(rest):
        depth += ch == "{"
        depth -= ch == "}"
        if depth == 0:
            return rest[1:i]
    return None  # unbalanced: the answer was cut off


_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
_REMOVE = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\displaystyle", "$", "^\\circ", "^{\\circ}",
           "\\%", "%", "\\$")


def normalize(answer: str) -> str:
    """Canonical LaTeX for string comparison: no spacing commands, units markup or `x =` prefix."""
    s = _TEXT_RE.sub(r"\1", answer)
    for token in _REMOVE:
        s = s.replace(token, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\sqrt\s*(\w)", r"\\sqrt{\1}", s)
    s = re.sub(r"\s+", "", s)
    s = re.sub(r"^[a-zA-Z]=", "", s)  # "x=5" -> "5"
    return s.rstrip(".")


def answers_match(pred: str, ground_truth: str) -> bool:
    a, b = normalize(pred), normalize(ground_truth)
    va, vb = parse_number(a), parse_number(b)
    if va is not None and vb is not None:
        return va == vb
    return a == b


def compute_score(solution_str: str, ground_truth: str) -> dict:
    """{"score": 1.0 if the last boxed answer matches else 0.0, "acc", "pred"}."""
    truth = str(ground_truth)
    truth = last_boxed(truth) or truth
    pred = last_boxed(solution_str)
    correct = pred is not None and answers_match(pred, truth)
    return {"score": 1.0 if correct else 0.0, "acc": correct, "pred": pred or ""}
