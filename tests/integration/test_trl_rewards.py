"""`CodeTestReward` against a real `verl-sf serve` on 127.0.0.1, and inside TRL's GRPOTrainer on CPU."""

from __future__ import annotations

import os
import threading
from typing import Optional

import pytest
from prometheus_client import REGISTRY

from tests.server_fixtures import ServerHandle, runs_finished, start_server, stop_server
from tests.waiting import wait_until
from verl_sf.rewards import CodeTestReward, Outcome
from verl_sf.rewards.example_tasks import EXAMPLE_TASKS, MAX_SUBARRAY_PROMPT, SORTING_PROMPT

INSERTION_SORT = ("    out = []\n    for x in xs:\n        i = 0\n        while i < len(out) and out[i] < x:\n"
                  "            i += 1\n        out.insert(i, x)\n    return out\n")
KADANE = ("    best = current = xs[0]\n    for x in xs[1:]:\n        current = max(x, current + x)\n"
          "        best = max(best, current)\n    return best\n")
ENDLESS = "    while True:\n        pass\n"

# (task prompt, completion, expected reward).  An exception raised by the function fails the test it was called
# for, as in the example's harness; an error that stops the harness (syntax error, time-out) is -1.
HAND_WRITTEN = [
    (SORTING_PROMPT, INSERTION_SORT + "\nprint('the model kept talking')\n", 1.0),
    (SORTING_PROMPT, INSERTION_SORT.replace("return out", "return out[:-1]"), 1 / 5),  # off by one: [] still passes
    (SORTING_PROMPT, "    return sorted(xs)\n", -1.0),
    (SORTING_PROMPT, "    import heapq\n    return list(xs)\n", -1.0),
    (SORTING_PROMPT, "    return [x for x in xs\n", -1.0),
    (SORTING_PROMPT, "    raise ValueError('no idea')\n", 0.0),
    (SORTING_PROMPT, ENDLESS, -1.0),
    (SORTING_PROMPT, "", -1.0),
    (SORTING_PROMPT, "def something_else():\n    pass\n", -1.0),
    (MAX_SUBARRAY_PROMPT, KADANE, 1.0),
    # Kadane started at 0: wrong on the two all-negative inputs only.
    (MAX_SUBARRAY_PROMPT, KADANE.replace("best = current = xs[0]", "best = current = 0").replace("xs[1:]", "xs"),
     5 / 7),
    (MAX_SUBARRAY_PROMPT, "    return max(xs[0], sum(xs)\n", -1.0),
    (MAX_SUBARRAY_PROMPT, "    return xs[len(xs)]\n", 0.0),
    (MAX_SUBARRAY_PROMPT, ENDLESS, -1.0),
    (MAX_SUBARRAY_PROMPT, "\n\n", -1.0),
]


def test_hand_written_completions_get_the_examples_rewards(reward_server: ServerHandle) -> None:
    with CodeTestReward(EXAMPLE_TASKS, sandbox_url=reward_server.url) as reward:
        rewards = reward([p for p, _, _ in HAND_WRITTEN], [c for _, c, _ in HAND_WRITTEN])
        assert rewards == pytest.approx([r for _, _, r in HAND_WRITTEN])
        assert reward.sandbox_failures == 0
        assert reward.outcomes == {"scored": 6, "banned": 2, "empty": 3, "error": 4}


def test_chat_completions_and_task_columns(reward_server: ServerHandle) -> None:
    prompt = [{"role": "user", "content": "Write max_subarray_sum(xs) in Python."}]
    answer = "```python\ndef max_subarray_sum(xs):\n" + KADANE + "```"
    completions = [
        [{"role": "assistant", "content": "Sure, Kadane's algorithm:\n" + answer + "\nIt is O(n)."}],
        [{"role": "assistant", "content": "```python\ndef max_subarray_sum(xs):\n    return sum(xs)\n```"}],
        [{"role": "assistant", "content": "I would rather not."}],  # prose is not a program: a SyntaxError
        [{"role": "assistant", "content": "```python\ndef sort_numbers(xs):\n    return sorted(xs)\n```"}],
    ]
    with CodeTestReward(EXAMPLE_TASKS, sandbox_url=reward_server.url) as reward:
        rewards = reward([prompt] * 4, completions, task=["max_subarray"] * 3 + ["sorting"])
    assert rewards == pytest.approx([1.0, 3 / 7, -1.0, -1.0])  # sum(xs) is right for [5], [-3], [1, 2, 3, 4]


def test_per_row_tests_from_dataset_columns(reward_server: ServerHandle) -> None:
    prompt = "def double(x: int) -> int:\n"
    with CodeTestReward(sandbox_url=reward_server.url, timeout_s=2) as reward:
        rewards = reward([prompt, prompt], ["    return 2 * x\n", "    return x + 2\n"],
                         func_name=["double", "double"], tests=[["1", "2", "-5"], ["1", "2", "-5"]],
                         reference=["_double", "_double"],
                         reference_code=["def _double(x):\n    return x * 2\n"] * 2, banned_patterns=[None, None])
    assert rewards == pytest.approx([1.0, 1 / 3])


def test_local_backend_scores_in_process() -> None:
    with CodeTestReward(EXAMPLE_TASKS, backend="local", local_options={"workers": 2}) as reward:
        assert reward([MAX_SUBARRAY_PROMPT] * 2, [KADANE, ENDLESS]) == [1.0, -1.0]


def _sandbox_failures_metric(name: str) -> float:
    return sum(REGISTRY.get_sample_value("verl_sf_reward_sandbox_failures_total", {"reward": name, "reason": reason})
               or 0.0 for reason in ("unavailable", "sandbox_error", "cpu_starved"))


def test_server_stopped_mid_batch_gives_none_never_a_score() -> None:
    server = start_server("--workers", "1")
    slow_correct = "    import time\n    time.sleep(0.3)\n" + KADANE
    logged: list[tuple[str, float]] = []
    rewards: list[Optional[float]] = []
    reward = CodeTestReward(EXAMPLE_TASKS, sandbox_url=server.url, timeout_s=10, max_concurrency=1, max_retries=1,
                            name="stopped_mid_batch")
    batch = threading.Thread(target=lambda: rewards.extend(
        reward([MAX_SUBARRAY_PROMPT] * 8, [slow_correct] * 8, log_metric=lambda k, v: logged.append((k, v)))))
    try:
        batch.start()
        # The task's reference run, then two completions': the run in flight as it stops is answered as a sandbox error.
        wait_until(lambda: runs_finished(server) >= 3, 120, "two completions of the batch scored")
    finally:
        stop_server(server.process)
        batch.join(timeout=120)
        reward.close()
    assert len(rewards) == 8
    assert set(rewards) <= {1.0, None}  # never -1 or 0 for a run that did not happen
    unscored = rewards.count(None)
    assert rewards.count(1.0) >= 2 and unscored >= 1
    assert reward.sandbox_failures == unscored
    assert logged == [("stopped_mid_batch/sandbox_failures", float(unscored)), ("stopped_mid_batch/suspected_hacks", 0.0)]
    assert _sandbox_failures_metric("stopped_mid_batch") == unscored


def test_overloaded_server_is_retried_after_retry_after_then_none() -> None:
    """--max-in-flight 1: a request finding one run in flight gets 503 + Retry-After."""
    server = start_server("--slots", "1", "--max-in-flight", "1")
    slow_correct = "    import time\n    time.sleep(0.5)\n" + KADANE
    try:
        with CodeTestReward(EXAMPLE_TASKS, sandbox_url=server.url, timeout_s=5, max_retries=0,
                            name="overloaded_no_retry") as impatient:
            rewards = impatient([MAX_SUBARRAY_PROMPT] * 3, [slow_correct] * 3)
            assert set(rewards) <= {1.0, None} and rewards.count(None) >= 1 and rewards.count(1.0) >= 1
            assert impatient.sandbox_failures == rewards.count(None)
        with CodeTestReward(EXAMPLE_TASKS, sandbox_url=server.url, timeout_s=5, max_retries=8,
                            name="overloaded_retried") as patient:
            assert patient([MAX_SUBARRAY_PROMPT] * 3, [slow_correct] * 3) == [1.0, 1.0, 1.0]
            assert patient.sandbox_failures == 0
    finally:
        stop_server(server.process)


def test_unreachable_server_is_none_for_every_completion() -> None:
    with CodeTestReward(EXAMPLE_TASKS, sandbox_url="http://127.0.0.1:9", max_retries=0, name="unreachable") as reward:
        # Banned and empty completions need no sandbox: they stay -1.
        rewards = reward([SORTING_PROMPT] * 3, [INSERTION_SORT, "    return sorted(xs)\n", ""])
        assert rewards == [None, -1.0, -1.0]
        assert reward.outcomes[Outcome.sandbox_failure.value] == 1


def test_grpo_trainer_two_steps_with_rewards_from_the_server(reward_server: ServerHandle, tmp_path) -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from datasets import Dataset
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    # Tokens are whole indented lines, so whatever the random model samples is a function body the harness runs.
    lines = ["    return xs\n", "    return xs[0]\n", "    return max(xs)\n", "    return sorted(xs)\n",
             "    out = list(xs)\n", "    return out\n", "    raise ValueError(xs)\n", "    return sum(xs)\n"]
    tokenizer_model = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer_model.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]*\n"), behavior="isolated")
    tokenizer_model.decoder = decoders.Fuse()
    special_tokens = ["[UNK]", "[PAD]", "[EOS]"]
    tokenizer_model.train_from_iterator(lines * 4, trainers.WordLevelTrainer(special_tokens=special_tokens))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer_model, unk_token="[UNK]", pad_token="[PAD]",
                                        eos_token="[EOS]")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=256, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None))
    dataset = Dataset.from_dict({"prompt": [task["prompt"] for task in EXAMPLE_TASKS.values()]})
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=8, max_steps=2, logging_steps=1, report_to="none", use_cpu=True,
                      bf16=False, save_strategy="no", seed=0)
    runs_before = runs_finished(reward_server)
    with CodeTestReward(EXAMPLE_TASKS, sandbox_url=reward_server.url) as reward:
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=args, train_dataset=dataset,
                              reward_funcs=[reward])
        trainer.train()
        outcomes = dict(reward.outcomes)
    steps = [record for record in trainer.state.log_history if "rewards/code_test/mean" in record]
    assert [record["step"] for record in steps] == [1, 2]
    for record in steps:
        assert -1.0 <= record["rewards/code_test/mean"] <= 1.0
        assert record["code_test/sandbox_failures"] == 0.0
        assert record["code_test/suspected_hacks"] == 0.0
    assert sum(outcomes.values()) == 2 * 4
    ran = outcomes.get("scored", 0) + outcomes.get("error", 0)
    # One run per completion that ran, plus one reference run for each of the two tasks that had such a completion.
    assert ran >= 1 and ran + 1 <= runs_finished(reward_server) - runs_before <= ran + 2


def test_verl_compute_score_reports_and_excludes_sandbox_failures(reward_server: ServerHandle) -> None:
    from verl_sf.rewards.code_reward import SandboxFailure, compute_score

    task = dict(EXAMPLE_TASKS["max_subarray"])
    fenced = "Here it is:\n```python\ndef max_subarray_sum(xs):\n" + KADANE + "```"
    assert compute_score("code", fenced, task, sandbox_url=reward_server.url) == {
        "score": 1.0, "acc": 1.0, "passed": 7.0, "total": 7.0, "sandbox_failure": 0.0, "suspected_hack": 0.0}
    body = compute_score("code", "    return sum(xs)\n", task, sandbox_url=reward_server.url)
    assert (body["score"], body["sandbox_failure"]) == (pytest.approx(3 / 7), 0.0)
    with CodeTestReward(EXAMPLE_TASKS, sandbox_url="http://127.0.0.1:9", max_retries=0) as unreachable, \
            pytest.raises(SandboxFailure, match="no verdict"):
        unreachable.compute_score("code", KADANE, "max_subarray")
    scored = compute_score("code", KADANE, task, sandbox_url="http://127.0.0.1:9", on_sandbox_failure="score",
                           failure_score=0.25, max_retries=0)
    assert (scored["score"], scored["sandbox_failure"]) == (0.25, 1.0)
