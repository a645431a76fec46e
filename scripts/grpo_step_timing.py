#!/usr/bin/env python3
"""A plain-PyTorch GRPO loop on the TRL + Daytona example's two code tasks, rewards from verl-sf, every phase timed.

The model is a tiny Qwen2-architecture model, randomly initialised, with a byte-level BPE tokenizer trained here on
the tasks' own text: nothing is downloaded.  Each step samples `--num-generations` function bodies per task (the
body's indentation ends the prompt), scores them with `verl_sf.rewards.CodeTestReward` against a verl-sf server
(the example's harness, 1 s time-out), turns the rewards into group-normalised advantages and takes one AdamW step
on the token-level policy-gradient loss (TRL's `dapo` normalisation, one update per batch, no KL term).  The phases
run one after another, each ended by a device synchronisation, so a step splits exactly into generation, reward
and optimizer time; while the rewards are computed the accelerator has nothing queued: `gpu_idle_share` is reward
time over step time.

Without --sandbox-url the script starts `verl-sf serve` on 127.0.0.1 itself and stops it at the end.
Writes `grpo_steps.json` (per step: the three phase times, the idle share, mean reward, outcomes) and
`grpo_steps.png` in --output-dir.

  python scripts/grpo_step_timing.py --device cuda --steps 5 --output-dir /tmp/grpo
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Optional

from verl_sf.rewards import CodeTestReward
from verl_sf.rewards.code_harness import BODY_INDENT
from verl_sf.rewards.example_tasks import EXAMPLE_TASKS
from verl_sf.server.process import start_server_process, stop_server_process

EOS = "<|endoftext|>"


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--sandbox-url", help="a running verl-sf server; without it one is started on 127.0.0.1")
    parser.add_argument("--device", default="auto", help="cpu, cuda, or auto (cuda when there is one)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--num-generations", type=int, default=16, help="completions per task per step")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=1024)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--timeout", type=float, default=1.0, help="per-completion harness time-out (s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="grpo_results")
    return parser.parse_args(argv)


def build_tokenizer(vocab_size: int) -> Any:
    """Byte-level BPE trained on the tasks' prompts and reference solutions: any sampled ids decode to text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [text for task in EXAMPLE_TASKS.values() for text in (task["prompt"], task["reference"])]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, pad_token=EOS)
    fast.padding_side = "left"  # generation continues each prompt from its last token
    return fast


def build_model(args: argparse.Namespace, vocab_size: int, device: Any) -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(args.seed)
    config = Qwen2Config(vocab_size=vocab_size, hidden_size=args.hidden_size, intermediate_size=4 * args.hidden_size,
                         num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, tie_word_embeddings=True)
    return Qwen2ForCausalLM(config).to(device)


def group_advantages(rewards: list[Optional[float]], group: int) -> tuple[list[float], list[bool]]:
    """GRPO's advantages: each reward less its group's mean, over the group's std; a completion the sandbox
    could not score (None) gets no advantage and is left out of the loss, as TRL leaves it out."""
    advantages, kept = [], []
    for start in range(0, len(rewards), group):
        chunk = rewards[start:start + group]
        scored = [r for r in chunk if r is not None]
        mean = statistics.fmean(scored) if scored else 0.0
        std = statistics.pstdev(scored) if len(scored) > 1 else 0.0
        advantages += [0.0 if r is None else (r - mean) / (std + 1e-4) for r in chunk]
        kept += [r is not None for r in chunk]
    return advantages, kept


def completion_mask(completion_ids: Any, eos_id: int) -> Any:
    """1 for each completion token up to and including its first EOS, 0 after."""
    import torch

    is_eos = completion_ids == eos_id
    after_eos = (torch.cumsum(is_eos.int(), dim=1) - is_eos.int()) > 0
    return (~after_eos).float()


def policy_loss(model: Any, sequences: Any, attention: Any, prompt_len: int, mask: Any, advantages: Any) -> Any:
    """Token-level policy gradient, summed over every kept token and divided by their count (`dapo`)."""
    import torch

    logits = model(input_ids=sequences, attention_mask=attention).logits[:, prompt_len - 1:-1].float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, sequences[:, prompt_len:, None]).squeeze(-1)
    return -(advantages[:, None] * logp * mask).sum() / mask.sum().clamp(min=1.0)


def run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    import torch

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    tokenizer = build_tokenizer(args.vocab_size)
    model = build_model(args, len(tokenizer), device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    prompts = [task["prompt"] for task in EXAMPLE_TASKS.values() for _ in range(args.num_generations)]
    # The body's indentation ends the model's prompt (a prefill): what it samples is a body the harness runs.
    batch = tokenizer([prompt + BODY_INDENT for prompt in prompts], return_tensors="pt", padding=True).to(device)
    prompt_len = batch["input_ids"].shape[1]
    reward = CodeTestReward(EXAMPLE_TASKS, sandbox_url=url, timeout_s=args.timeout, progress=False)
    steps = []
    try:
        for step in range(1, args.steps + 1):
            outcomes_before = dict(reward.outcomes)
            sync()
            started = time.perf_counter()
            model.eval()
            with torch.no_grad():
                sequences = model.generate(**batch, do_sample=True, top_k=0, max_new_tokens=args.max_new_tokens,
                                           min_new_tokens=args.max_new_tokens // 4,
                                           pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
            sync()
            generated = time.perf_counter()
            completion_ids = sequences[:, prompt_len:]
            texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
            rewards = reward(prompts=prompts, completions=[BODY_INDENT + text for text in texts])
            scored = time.perf_counter()
            advantages, kept = group_advantages(rewards, args.num_generations)
            model.train()
            mask = completion_mask(completion_ids, tokenizer.eos_token_id) * torch.tensor(kept, device=device)[:, None]
            attention = torch.cat([batch["attention_mask"], torch.ones_like(completion_ids)], dim=1)
            loss = policy_loss(model, sequences, attention, prompt_len, mask,
                               torch.tensor(advantages, device=device))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sync()
            ended = time.perf_counter()
            valid = [r for r in rewards if r is not None]
            record = {
                "step": step, "generation_s": generated - started, "reward_s": scored - generated,
                "optimizer_s": ended - scored, "step_s": ended - started,
                "gpu_idle_share": (scored - generated) / (ended - started),
                "completions": len(texts), "completion_tokens": int(mask.sum().item()),
                "mean_reward": statistics.fmean(valid) if valid else None, "loss": float(loss.item()),
                "sandbox_failures": sum(r is None for r in rewards),
                "outcomes": {k: v - outcomes_before.get(k, 0) for k, v in reward.outcomes.items()
                             if v - outcomes_before.get(k, 0)},
            }
            steps.append(record)
            print(json.dumps(record), flush=True)
    finally:
        reward.close()
    later = steps[1:] or steps  # the first step pays the reference runs and the warm-up
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "model": {"architecture": "Qwen2ForCausalLM (random init)",
                  "parameters": sum(p.numel() for p in model.parameters()),
                  "hidden_size": args.hidden_size, "layers": args.layers, "vocab": len(tokenizer)},
        "settings": {"tasks": len(EXAMPLE_TASKS), "num_generations": args.num_generations,
                     "max_new_tokens": args.max_new_tokens, "reward_timeout_s": args.timeout},
        "steps": steps,
        "median_after_first": {key: statistics.median(s[key] for s in later)
                               for key in ("generation_s", "reward_s", "optimizer_s", "step_s", "gpu_idle_share")},
    }


def plot(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = result["steps"]
    x = [s["step"] for s in steps]
    fig, ax = plt.subplots(figsize=(7, 4))
    bottom = [0.0] * len(steps)
    for key, label, colour in (("generation_s", "generation", "tab:blue"), ("reward_s", "rewards (GPU idle)",
                                                                               "tab:red"),
                               ("optimizer_s", "optimizer", "tab:green")):
        values = [s[key] for s in steps]
        ax.bar(x, values, bottom=bottom, label=label, color=colour)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    for xi, top, s in zip(x, bottom, steps, strict=True):
        ax.annotate(f"{s['gpu_idle_share']:.0%} idle", (xi, top), ha="center", va="bottom", fontsize=8)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("seconds")
    ax.set_title(f"GRPO step split on {result['device']}, rewards from verl-sf")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    args = parse_args(argv)
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    server, url = None, args.sandbox_url
    if url is None:
        server, url = start_server_process("--slots", str(os.cpu_count() or 4))
    try:
        result = run(args, url)
    finally:
        if server is not None:
            stop_server_process(server)
    (output / "grpo_steps.json").write_text(json.dumps(result, indent=1))
    plot(result, output / "grpo_steps.png")
    print(json.dumps(result["median_after_first"]))
    return result


if __name__ == "__main__":
    main()
