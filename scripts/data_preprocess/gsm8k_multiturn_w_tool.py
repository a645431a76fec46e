#!/usr/bin/env python3
"""GSM8K -> verl's multi-turn-with-tool parquet, for the `code_interpreter` tool.

    # from the Hugging Face hub (needs internet)
    python scripts/data_preprocess/gsm8k_multiturn_w_tool.py --local_save_dir ~/data/gsm8k_sf_tool
    # from local gsm8k files: a directory with train/test .jsonl/.parquet, or one file
    python scripts/data_preprocess/gsm8k_multiturn_w_tool.py --local_dataset_path tests/data/gsm8k_sample \\
        --local_save_dir /tmp/gsm8k_sf_tool

Writes `{split}.parquet` with verl's columns: `data_source`, `agent_name: tool_agent` (so
verl's agent loop runs the tool loop), chat `prompt` (a system message asking for the
tool and `#### <answer>`), `ability`, `reward_model.ground_truth`, and `extra_info` with
`tools_kwargs.code_interpreter.create_kwargs.ground_truth` (verl passes it to the tool's
`create`). `verl-sf rollout --data` reads the same files.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterable
from typing import Any, Optional

from verl_sf.errors import VerlSfError

DATA_SOURCE = "openai/gsm8k"
HF_DATASET = "openai/gsm8k"
TOOL_NAME = "code_interpreter"
SPLITS = ("train", "test")
SYSTEM_PROMPT = (
    "You are a math expert. You are given a question and you need to solve it step by step. "
    "Reason step by step before any tool call. "
    f"Use the `{TOOL_NAME}` tool to run Python code for every calculation: it returns what the code "
    "prints, so print the values you need. "
    "Put your final answer in the format of `#### <answer>`."
)
INSTRUCTION = "Let's think step by step and output the final answer after `####`."
_ANSWER_RE = re.compile(r"####\s*(-?[0-9.,]+)")


class PreprocessError(VerlSfError, ValueError):
    """An input row or file is not gsm8k-shaped (the message names which)."""


def extract_solution(answer: str, where: str) -> str:
    """The number after `#### ` in a gsm8k answer, without thousands commas."""
    match = _ANSWER_RE.search(answer)
    if match is None:
        raise PreprocessError(f"{where}: 'answer' has no '#### <number>' line")
    return match.group(1).replace(",", "").rstrip(".")


def make_row(example: dict[str, Any], split: str, index: int) -> dict[str, Any]:
    where = f"{split} row {index}"
    question, answer = example.get("question"), example.get("answer")
    if not isinstance(question, str) or not isinstance(answer, str):
        raise PreprocessError(f"{where}: gsm8k rows need string 'question' and 'answer'")
    solution = extract_solution(answer, where)
    return {
        "data_source": DATA_SOURCE,
        "agent_name": "tool_agent",
        "prompt": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"{question} {INSTRUCTION}"},
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": solution},
        "extra_info": {
            "split": split,
            "index": index,
            "answer": answer,
            "question": question,
            "need_tools_kwargs": True,
            "tools_kwargs": {TOOL_NAME: {"create_kwargs": {"ground_truth": solution}}},
        },
    }


def read_examples(path: str) -> list[dict[str, Any]]:
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    with open(path) as f:
        if path.endswith(".json"):
            return json.load(f)
        return [json.loads(line) for line in f if line.strip()]


def local_splits(path: str, split: str) -> dict[str, list[dict[str, Any]]]:
    """A file is one split (`split`); a directory holds `train.*` / `test.*` (.jsonl, .json, .parquet),
    directly or under `main/` as in the Hugging Face repo layout."""
    if os.path.isfile(path):
        return {split: read_examples(path)}
    if not os.path.isdir(path):
        raise PreprocessError(f"--local_dataset_path {path!r} does not exist")
    found: dict[str, list[dict[str, Any]]] = {}
    for directory in (path, os.path.join(path, "main")):
        if not os.path.isdir(directory):
            continue
        for name in sorted(os.listdir(directory)):
            stem = name.split(".")[0].split("-")[0]
            if stem in SPLITS and stem not in found and name.endswith((".jsonl", ".json", ".parquet")):
                found[stem] = read_examples(os.path.join(directory, name))
    if not found:
        raise PreprocessError(f"{path}: no train.* or test.* gsm8k file (.jsonl, .json or .parquet)")
    return found


def hub_splits() -> dict[str, list[dict[str, Any]]]:
    import datasets

    dataset = datasets.load_dataset(HF_DATASET, "main")
    return {split: list(dataset[split]) for split in SPLITS}


def write_parquet(rows: Iterable[dict[str, Any]], path: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(list(rows)), path)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--local_dataset_path", help="local gsm8k file or directory (default: the HF dataset)")
    parser.add_argument("--split", default="train", choices=SPLITS, help="split name for a single input file")
    parser.add_argument("--local_save_dir", default="~/data/gsm8k_sf_tool", help="where {split}.parquet go")
    parser.add_argument("--limit", type=int, help="keep only the first N examples of each split")
    args = parser.parse_args(argv)
    try:
        splits = local_splits(args.local_dataset_path, args.split) if args.local_dataset_path else hub_splits()
        rows_by_split = {
            split: [make_row(example, split, i) for i, example in enumerate(examples[: args.limit])]
            for split, examples in splits.items()
        }
    except (PreprocessError, json.JSONDecodeError, OSError) as exc:
        print(f"gsm8k_multiturn_w_tool: error: {exc}", file=sys.stderr)
        return 2
    save_dir = os.path.expanduser(args.local_save_dir)
    os.makedirs(save_dir, exist_ok=True)
    for split, rows in rows_by_split.items():
        path = os.path.join(save_dir, f"{split}.parquet")
        write_parquet(rows, path)
        print(f"wrote {len(rows)} rows to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
