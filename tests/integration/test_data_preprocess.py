"""scripts/data_preprocess/gsm8k_multiturn_w_tool.py on the shipped sample, read back by verl."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "data_preprocess", "gsm8k_multiturn_w_tool.py")
SAMPLE = os.path.join(ROOT, "tests", "data", "gsm8k_sample")


def preprocess(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("gsm8k_sf_tool"))
    proc = preprocess("--local_dataset_path", SAMPLE, "--local_save_dir", out)
    assert proc.returncode == 0, proc.stderr
    assert "wrote 40 rows" in proc.stdout and "wrote 8 rows" in proc.stdout
    return out


def test_sample_is_gsm8k_shaped() -> None:
    for split, count in (("train", 40), ("test", 8)):
        rows = [json.loads(line) for line in Path(SAMPLE, f"{split}.jsonl").read_text().splitlines()]
        assert len(rows) == count
        assert all(set(r) == {"question", "answer"} and "\n#### " in r["answer"] for r in rows)


def test_rows_have_verls_multiturn_tool_format(out_dir: str) -> None:
    import pyarrow.parquet as pq

    rows = pq.read_table(os.path.join(out_dir, "train.parquet")).to_pylist()
    row = rows[0]
    assert row["data_source"] == "openai/gsm8k" and row["agent_name"] == "tool_agent" and row["ability"] == "math"
    system, user = row["prompt"]
    assert system["role"] == "system" and "`code_interpreter`" in system["content"] and "#### <answer>" in system["content"]
    assert user["role"] == "user" and user["content"].startswith("Maya buys 4 notebooks")
    assert row["reward_model"] == {"style": "rule", "ground_truth": "14"}
    extra = row["extra_info"]
    assert extra["tools_kwargs"] == {"code_interpreter": {"create_kwargs": {"ground_truth": "14"}}}
    assert (extra["split"], extra["index"], extra["need_tools_kwargs"]) == ("train", 0, True)
    assert [r["reward_model"]["ground_truth"] for r in rows][27] == "637.5"  # decimals kept


def test_verl_rlhf_dataset_reads_it(out_dir: str, tmp_path) -> None:
    """verl's own RLHFDataset loads the file and hands the agent loop what it needs."""
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    config = OmegaConf.create({"filter_overlong_prompts": False, "cache_dir": str(tmp_path), "return_raw_chat": True})
    dataset = RLHFDataset(os.path.join(out_dir, "test.parquet"), tokenizer=None, config=config)
    assert len(dataset) == 8
    item = dataset[0]
    assert [m["role"] for m in item["raw_prompt"]] == ["system", "user"]
    assert item["tools_kwargs"]["code_interpreter"]["create_kwargs"]["ground_truth"] == "94"
    assert item["agent_name"] == "tool_agent"


def test_rollout_loader_reads_it(out_dir: str) -> None:
    from verl_sf.rollout import load_samples

    samples = load_samples(os.path.join(out_dir, "test.parquet"))
    assert [s.ground_truth for s in samples] == ["94", "9", "36", "6", "8", "391", "40", "24"]
    assert samples[1].tools_kwargs == {"code_interpreter": {"create_kwargs": {"ground_truth": samples[1].ground_truth}}}


def test_single_file_and_limit(tmp_path) -> None:
    proc = preprocess("--local_dataset_path", os.path.join(SAMPLE, "test.jsonl"), "--split", "test",
                      "--limit", "3", "--local_save_dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["test.parquet"]


@pytest.mark.parametrize("content, error", [
    ('{"question": "q", "answer": "no marker"}\n', "train row 0: 'answer' has no '#### <number>' line"),
    ('{"question": 3, "answer": "#### 3"}\n', "train row 0: gsm8k rows need string 'question' and 'answer'"),
])
def test_bad_input_is_named(tmp_path, content: str, error: str) -> None:
    src = tmp_path / "train.jsonl"
    src.write_text(content)
    proc = preprocess("--local_dataset_path", str(src), "--local_save_dir", str(tmp_path / "out"))
    assert proc.returncode == 2 and error in proc.stderr


def test_missing_input(tmp_path) -> None:
    proc = preprocess("--local_dataset_path", str(tmp_path / "nope"), "--local_save_dir", str(tmp_path))
    assert proc.returncode == 2 and "does not exist" in proc.stderr
