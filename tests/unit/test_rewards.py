"""verl_sf.rewards: verl's compute_score contract, gsm8k and boxed answers."""

from __future__ import annotations

import pytest

from verl_sf.rewards import compute_score, scorer_for
from verl_sf.rewards.boxed import last_boxed, normalize
from verl_sf.rewards.gsm8k import extract_answer
from verl_sf.rewards.numbers import parse_number


@pytest.mark.parametrize("solution, truth, expected", [
    ("She pays 5 * 3 = 15.\n#### 15", "15", 1.0),
    ("#### 1,000", "1000", 1.0),
    ("#### $18.00", "18", 1.0),
    ("#### -3", "-3", 1.0),
    ("#### 0.5", "1/2", 1.0),
    ("first #### 12 then corrected #### 13", "13", 1.0),  # the last answer counts
    ("first #### 13 then corrected #### 12", "13", 0.0),
    ("The answer is 15.", "15", 0.0),  # strict format, as verl's gsm8k
    ("#### 15", "#### 15", 1.0),  # a full gsm8k solution as ground truth
    ("#### 16", "Natalia sold 48/2 = 24 clips.\n#### 15", 0.0),
])
def test_gsm8k(solution: str, truth: str, expected: float) -> None:
    result = compute_score("openai/gsm8k", solution, truth)
    assert result["score"] == expected
    assert result["acc"] is (expected == 1.0)


def test_gsm8k_pred_is_reported() -> None:
    assert compute_score("gsm8k", "so #### 1,234", "1234")["pred"] == "1,234"
    assert compute_score("gsm8k", "no answer", "1")["pred"] == ""


def test_gsm8k_bad_ground_truth_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not a number"):
        compute_score("openai/gsm8k", "#### 3", "three")


@pytest.mark.parametrize("solution, truth, expected", [
    (r"so \boxed{\frac{1}{2}}", "0.5", 1.0),
    (r"\boxed{\dfrac12}", r"\frac{1}{2}", 1.0),
    (r"\boxed{x = 5}", "5", 1.0),
    (r"\boxed{10\%}", "10", 1.0),
    (r"\boxed{90^\circ}", "90", 1.0),
    (r"\boxed{\text{(B)}}", "(B)", 1.0),
    (r"\boxed{\sqrt{2}}", r"\sqrt 2", 1.0),
    (r"\boxed{3} then \boxed{4}", "4", 1.0),
    (r"\boxed{\frac{a+b}{2}}", r"\boxed{\frac{a + b}{2}}", 1.0),
    (r"\boxed{4}", "5", 0.0),
    (r"\boxed{4", "4", 0.0),  # cut off mid-answer
    ("4", "4", 0.0),  # no box
])
def test_boxed(solution: str, truth: str, expected: float) -> None:
    assert compute_score("aime_2024", solution, truth)["score"] == expected


def test_last_boxed_forms() -> None:
    assert last_boxed(r"\boxed{a{b}c}") == "a{b}c"
    assert last_boxed(r"$\boxed 7$") == "7"
    assert last_boxed(r"\fbox{9}") == "9"
    assert last_boxed(r"\boxedx") is None
    assert normalize(r"\left( 1, 2 \right)") == "(1,2)"


def test_parse_number() -> None:
    assert parse_number("1,000") == 1000
    assert parse_number("1,00") is None  # not a thousands separator
    assert parse_number("-\\frac{3}{4}") == parse_number("-0.75")
    assert parse_number("1/0") is None
    assert parse_number("abc") is None


@pytest.mark.parametrize("source, scorer", [
    ("openai/gsm8k", "gsm8k"), ("gsm8k", "gsm8k"), ("lighteval/MATH", "math"), ("aime_2024", "math"),
    ("BytedTsinghua-SIA/DAPO-Math-17k", "math"), ("retool_aime", "math"),
])
def test_scorer_for(source: str, scorer: str) -> None:
    assert scorer_for(source) == scorer


def test_unknown_data_source_names_it() -> None:
    with pytest.raises(ValueError, match="'codecontests'"):
        compute_score("codecontests", "x", "y")


def test_verl_loads_it_as_custom_reward_function() -> None:
    """verl resolves `reward.custom_reward_function` through load_extern_object; pkg:// must work."""
    from verl.utils.import_utils import load_extern_object

    fn = load_extern_object("pkg://verl_sf.rewards", "compute_score")
    # verl passes keyword arguments, sometimes with extra ones (reward_router_address, ...).
    result = fn(data_source="openai/gsm8k", solution_str="#### 7", ground_truth="7", extra_info={}, reward_router_address=None)
    assert result == {"score": 1.0, "acc": True, "pred": "7"}
    assert extract_answer("#### 7") == "7"
