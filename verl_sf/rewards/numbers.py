"""Reading a written number the way a grader would: `1,000`, `$18.00`, `3/4`, `\\frac{3}{4}`.

Shared by the gsm8k and boxed-answer rewards so "18" and "18.00" are the same answer in both.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Optional

_FRAC_RE = re.compile(r"^(-?)\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}$")
_SHORT_FRAC_RE = re.compile(r"^(-?)\\[dt]?frac(\d)(\d)$")
_THOUSANDS_RE = re.compile(r"^-?\d{1,3}(,\d{3})+(\.\d+)?$")


def parse_number(text: str) -> Optional[Fraction]:
    """The exact value of `text`, or None when it is not a plain number.

    Exact (Fraction) rather than float so 0.1 + 0.2 style noise never flips a grade.
    Commas are only accepted as thousands separators ("1,000"), never as decimal marks.
    """
    s = text.strip().replace("$", "").replace(" ", "")
    if s.endswith("."):
        s = s[:-1]
    if _THOUSANDS_RE.match(s):
        s = s.replace(",", "")
    for pattern in (_FRAC_RE, _SHORT_FRAC_RE):
        match = pattern.match(s)
        if match:
            sign, num, den = match.groups()
            value = _ratio(_fraction(num), _fraction(den))
            return -value if (sign and value is not None) else value
    if s.count("/") == 1:
        num, den = s.split("/")
        return _ratio(_fraction(num), _fraction(den))
    return _fraction(s)


def _fraction(s: str) -> Optional[Fraction]:
    if not re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", s):
        return None
    return Fraction(s)


def _ratio(num: Optional[Fraction], den: Optional[Fraction]) -> Optional[Fraction]:
    if num is None or not den:
        return None
    return num / den
