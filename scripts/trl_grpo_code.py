#!/usr/bin/env python3
"""GRPO on the TRL + Daytona example's two code tasks, with rewards from verl-sf instead of 500 cloud sandboxes.

The tasks, harness, scoring (-1 for an error or a banned pattern, else the fraction of tests passed), the 1 s
time-out and the GRPOConfig are the example's; the reward is `verl_sf.rewards.CodeTestReward`.  Without
--sandbox-url the script starts `verl-sf serve` on 127.0.0.1 itself and stops it at the end.  Completions the
sandbox could not run get reward None (left out by TRL) and are counted in `code_test/sandbox_failures`; completions
that did something only an exploit of the reward does are counted in `code_test/suspected_hacks`.

Examples:
  python scripts/trl_grpo_code.py                                  # the example's run (GPU, vLLM colocate)
  python scripts/trl_grpo_code.py --sandbox-url http://127.0.0.1:8080 --no-vllm --model ./my-small-model

Outputs in --output-dir: metrics.jsonl (trainer.state.log_history, one record a line) and rewards.png.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, Optional

from verl_sf.rewards import CodeTestReward
from verl_sf.rewards.example_tasks import EXAMPLE_TASKS
from verl_sf.server.process import start_server_process, stop_server_process


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="Qwen/Qwen3-1.7B-Base", help="model id or local path")
    parser.add_argument("--sandbox-url", help="a running verl-sf server; without it one is started on 127.0.0.1")
    parser.add_argument("--server-workers", type=int, default=os.cpu_count() or 4,
                        help="sandbox slots of the server the script starts")
    parser.add_argument("--output-dir", default="training_results")
    parser.add_argument("--timeout", type=float, default=1.0, help="per-completion harness time-out (s)")
    parser.add_argument("--max-concurrency", type=int, default=64, help="harness runs in flight at once")
    parser.add_argument("--max-steps", type=int, default=8)
    parser.add_argument("--num-generations", type=int, default=250)
    parser.add_argument("--per-device-train-batch-size", type=int, default=20)
    parser.add_argument("--gradient-accumulation-steps", type=int, default=25)
    parser.add_argument("--max-completion-length", type=int, default=512)
    parser.add_argument("--learning-rate", type=float, default=8e-6)
    parser.add_argument("--no-vllm", action="store_true", help="generate with transformers instead of vLLM")
    parser.add_argument("--no-bf16", action="store_true", help="train in fp32 (CPU)")
    return parser.parse_args(argv)


def grpo_config(args: argparse.Namespace) -> Any:
    """The example's GRPOConfig on TRL 1.x (which no longer has max_prompt_length: prompts are short here)."""
    from trl import GRPOConfig

    vllm: dict[str, Any] = {} if args.no_vllm else {"use_vllm": True, "vllm_mode": "colocate",
                                                    "vllm_gpu_memory_utilization": 0.15}
    return GRPOConfig(
        output_dir=args.output_dir,
        per_device_train_batch_size=args.per_device_train_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        learning_rate=args.learning_rate,
        num_train_epochs=1,
        logging_steps=1,
        report_to="none",
        max_steps=args.max_steps,
        bf16=not args.no_bf16,
        gradient_checkpointing=not args.no_vllm,
        loss_type="dapo",
        beta=0.01,
        **vllm,
    )


def write_metrics(log_history: list[dict[str, Any]], output_dir: Path) -> Path:
    path = output_dir / "metrics.jsonl"
    with path.open("w") as out:
        for record in log_history:
            out.write(json.dumps(record) + "\n")
    return path


def plot_rewards(log_history: list[dict[str, Any]], output_dir: Path, reward_name: str) -> Path:
    """Mean reward per step (with its std band); sandbox failures and suspected hacks per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r for r in log_history if "reward" in r]
    x = [r["step"] for r in steps]
    mean = [r["reward"] for r in steps]
    std = [r.get("reward_std", 0.0) for r in steps]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, height_ratios=(3, 1))
    top.plot(x, mean, marker="o", label="mean reward")
    top.fill_between(x, [m - s for m, s in zip(mean, std, strict=True)],
                     [m + s for m, s in zip(mean, std, strict=True)], alpha=0.2, label="± std")
    top.set_ylabel("reward (-1 error/banned, else pass rate)")
    top.legend()
    width = 0.4
    bottom.bar([step - width / 2 for step in x], [r.get(f"{reward_name}/sandbox_failures", 0.0) for r in steps],
               width, color="tab:red", label="sandbox failures")
    bottom.bar([step + width / 2 for step in x], [r.get(f"{reward_name}/suspected_hacks", 0.0) for r in steps],
               width, color="tab:purple", label="suspected hacks")
    bottom.set_ylabel("completions")
    bottom.legend()
    bottom.set_xlabel("step")
    fig.suptitle("GRPO on the example's code tasks, rewards from verl-sf")
    fig.tight_layout()
    path = output_dir / "rewards.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    from datasets import Dataset  # type: ignore[import-untyped]
    from trl import GRPOTrainer

    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    server = None
    url = args.sandbox_url
    if url is None:
        server, url = start_server_process("--workers", str(args.server_workers))
        print(f"started verl-sf serve at {url}")
    reward = CodeTestReward(EXAMPLE_TASKS, sandbox_url=url, timeout_s=args.timeout,
                            max_concurrency=args.max_concurrency)
    try:
        dataset = Dataset.from_dict({"prompt": [task["prompt"] for task in EXAMPLE_TASKS.values()]})
        trainer = GRPOTrainer(model=args.model, args=grpo_config(args), train_dataset=dataset, reward_funcs=[reward])
        trainer.train()
        history = trainer.state.log_history
        print("wrote", write_metrics(history, output_dir))
        print("wrote", plot_rewards(history, output_dir, reward.__name__))
        print(f"sandbox failures over the run: {reward.sandbox_failures}; suspected hacks: {reward.suspected_hacks}; "
              f"outcomes: {dict(reward.outcomes)}")
    finally:
        reward.close()
        if server is not None:
            stop_server_process(server)


if __name__ == "__main__":
    main()
