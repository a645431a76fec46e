"""Prompts in verl's RL dataset format, read from parquet or jsonl.

Each row carries `prompt` (chat messages), `data_source`, `reward_model.ground_truth` and
optionally `extra_info.tools_kwargs` — what verl's preprocessing scripts write and
`RLHFDataset` reads — so one file serves both training and standalone rollouts.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Optional

from verl_sf.errors import VerlSfError


class DatasetError(VerlSfError, ValueError):
    """The dataset file is missing or a row lacks a field the rollout needs (named in the message)."""


@dataclasses.dataclass
class Sample:
    index: int
    data_source: str
    messages: list[dict[str, Any]]
    ground_truth: Any
    extra_info: dict[str, Any]

    @property
    def tools_kwargs(self) -> dict[str, Any]:
        return self.extra_info.get("tools_kwargs") or {}


def read_rows(path: str) -> list[dict[str, Any]]:
    """Rows of a .parquet, .jsonl or .json (list of objects) file."""
    if not os.path.isfile(path):
        raise DatasetError(f"dataset {path!r} does not exist")
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DatasetError(f"reading {path!r} needs pyarrow (pip install pyarrow), or pass a .jsonl file") from None
        return pq.read_table(path).to_pylist()
    with open(path) as f:
        if path.endswith(".json"):
            rows = json.load(f)
            if not isinstance(rows, list):
                raise DatasetError(f"{path}: a .json dataset must be a list of objects")
            return rows
        rows = []
        for line_no, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise DatasetError(f"{path}:{line_no}: not JSON: {exc}") from None
        return rows


def load_samples(path: str, limit: Optional[int] = None, prompt_key: str = "prompt") -> list[Sample]:
    """Validate and convert rows; the first bad row raises DatasetError naming row and field."""
    rows = read_rows(path)
    if limit is not None:
        rows = rows[:limit]
    if not rows:
        raise DatasetError(f"dataset {path!r} has no rows")
    return [_sample(row, i, path, prompt_key) for i, row in enumerate(rows)]


def _sample(row: Any, index: int, path: str, prompt_key: str) -> Sample:
    where = f"{path}: row {index}"
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected an object, got {type(row).__name__}")
    messages = row.get(prompt_key)
    if not isinstance(messages, list) or not messages:
        raise DatasetError(f"{where}: '{prompt_key}' must be a non-empty list of chat messages")
    for j, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or not isinstance(
            message.get("content"), str
        ):
            raise DatasetError(f"{where}: {prompt_key}[{j}] must have string 'role' and 'content'")
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, dict) or reward_model.get("ground_truth") is None:
        raise DatasetError(f"{where}: 'reward_model.ground_truth' is required")
    data_source = row.get("data_source")
    if not isinstance(data_source, str) or not data_source:
        raise DatasetError(f"{where}: 'data_source' (a string) is required")
    extra_info = row.get("extra_info") or {}
    if not isinstance(extra_info, dict):
        raise DatasetError(f"{where}: 'extra_info' must be an object")
    return Sample(
        index=index,
        data_source=data_source,
        # Parquet structs give every message every key seen in the column; keep only what is set.
        messages=[{k: v for k, v in m.items() if v is not None} for m in messages],
        ground_truth=reward_model["ground_truth"],
        extra_info=extra_info,
    )
