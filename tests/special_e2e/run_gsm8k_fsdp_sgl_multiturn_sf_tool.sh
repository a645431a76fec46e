#!/usr/bin/env bash
# GRPO on GSM8K with sglang multi-turn rollout and verl-sf's code_interpreter tool (GPU).
#
#   bash tests/special_e2e/run_gsm8k_fsdp_sgl_multiturn_sf_tool.sh [extra Hydra overrides...]
#
# What it does, from any working directory:
#   1. starts `verl-sf serve` on 127.0.0.1 (stopped on exit, whatever happens);
#   2. writes verl-format parquet with scripts/data_preprocess/gsm8k_multiturn_w_tool.py;
#   3. writes a copy of configs/sandbox_fusion_tool_config.yaml pointing at that server;
#   4. runs verl's GRPO (`python3 -m verl.trainer.main_ppo`, FSDP + sglang, multi-turn tool agent),
#      dumping every step's rollouts to trainer.rollout_data_dir.
#
# Settings (environment):
#   MODEL_PATH        model to train (Qwen/Qwen2.5-0.5B-Instruct)
#   NGPUS             GPUs on this node (all that nvidia-smi lists, else 1)
#   GSM8K_LOCAL       local gsm8k file or directory (default: the openai/gsm8k dataset from the hub)
#   DATA_DIR          where the parquet go ($HOME/data/gsm8k_sf_tool)
#   ROLLOUT_DATA_DIR  rollout dumps, {step}.jsonl ($PWD/rollouts/gsm8k_sf_tool)
#   TOTAL_STEPS       training steps (20); TRAIN_BATCH_SIZE (32); ROLLOUT_N (4)
#   SF_PORT           sandbox server port (8080; 0 picks a free one); SF_SERVE_ARGS extra `serve` flags
#   NUM_WORKERS       tool pool's num_workers (16); RATE_LIMIT cluster-wide executions in flight (32)
#   WORK_DIR          generated tool config and server log (a temporary directory, removed on exit)
#   PYTHON            interpreter with verl and verl-sf installed (python3)
#   VERL_SF_CONFIG_OUT  if set: compose verl's configuration with all overrides (Hydra `--cfg job`),
#                     write it to this file and stop instead of training (what CI checks on CPU)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-python3}
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-0.5B-Instruct}
if [ -z "${NGPUS:-}" ]; then
  NGPUS=$(nvidia-smi --list-gpus 2>/dev/null | wc -l || true)
  [ "${NGPUS:-0}" -gt 0 ] || NGPUS=1
fi
DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k_sf_tool}
ROLLOUT_DATA_DIR=${ROLLOUT_DATA_DIR:-$PWD/rollouts/gsm8k_sf_tool}
TOTAL_STEPS=${TOTAL_STEPS:-20}
TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-32}
ROLLOUT_N=${ROLLOUT_N:-4}
SF_PORT=${SF_PORT:-8080}
NUM_WORKERS=${NUM_WORKERS:-16}
RATE_LIMIT=${RATE_LIMIT:-32}

if [ -n "${WORK_DIR:-}" ]; then
  mkdir -p "$WORK_DIR"; OWN_WORK_DIR=0
else
  WORK_DIR=$(mktemp -d -t verl-sf-e2e.XXXXXX); OWN_WORK_DIR=1
fi
SERVER_PID=""

cleanup() {
  local status=$?
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  [ "$OWN_WORK_DIR" = 1 ] && rm -rf "$WORK_DIR"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# 1. The sandbox server.
SERVE_LOG="$WORK_DIR/verl-sf-serve.log"
: >"$SERVE_LOG"  # there before the loop below reads it: the server's own redirect may come later
# shellcheck disable=SC2086  # SF_SERVE_ARGS is a list of flags
"$PYTHON" -m verl_sf.cli serve --host 127.0.0.1 --port "$SF_PORT" ${SF_SERVE_ARGS:-} >"$SERVE_LOG" 2>&1 &
SERVER_PID=$!
SF_URL=""
for _ in $(seq 600); do
  SF_URL=$(sed -n 's/.*listening on \(http:\/\/127\.0\.0\.1:[0-9]*\).*/\1/p' "$SERVE_LOG" | head -n1)
  [ -n "$SF_URL" ] && break
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    echo "verl-sf serve exited before listening:" >&2; tail -n 20 "$SERVE_LOG" >&2; exit 1
  fi
  sleep 0.1
done
[ -n "$SF_URL" ] || { echo "verl-sf serve did not start within 60 s:" >&2; tail -n 20 "$SERVE_LOG" >&2; exit 1; }
echo "sandbox server: $SF_URL (log: $SERVE_LOG)"

# 2. The data.
"$PYTHON" "$ROOT/scripts/data_preprocess/gsm8k_multiturn_w_tool.py" --local_save_dir "$DATA_DIR" \
  ${GSM8K_LOCAL:+--local_dataset_path "$GSM8K_LOCAL"}

# 3. The tool config, pointed at this server.
TOOL_CONFIG="$WORK_DIR/sandbox_fusion_tool_config.yaml"
"$PYTHON" - "$ROOT/configs/sandbox_fusion_tool_config.yaml" "$TOOL_CONFIG" "$SF_URL/run_code" \
  "$NUM_WORKERS" "$RATE_LIMIT" <<'EOF'
import sys

import yaml

src, dst, url, num_workers, rate_limit = sys.argv[1:]
with open(src) as f:
    document = yaml.safe_load(f)
for tool in document["tools"]:
    tool["config"].update(sandbox_fusion_url=url, num_workers=int(num_workers), rate_limit=int(rate_limit))
with open(dst, "w") as f:
    yaml.safe_dump(document, f, sort_keys=False)
EOF

# 4. GRPO with sglang multi-turn rollout and the code_interpreter tool.
OVERRIDES=(
  algorithm.adv_estimator=grpo
  algorithm.use_kl_in_reward=False
  data.train_files="$DATA_DIR/train.parquet"
  data.val_files="$DATA_DIR/test.parquet"
  data.train_batch_size="$TRAIN_BATCH_SIZE"
  data.max_prompt_length=1024
  data.max_response_length=2048
  data.filter_overlong_prompts=True
  data.truncation=error
  data.return_raw_chat=True
  actor_rollout_ref.model.path="$MODEL_PATH"
  actor_rollout_ref.model.use_remove_padding=True
  actor_rollout_ref.model.enable_gradient_checkpointing=True
  actor_rollout_ref.actor.optim.lr=1e-6
  actor_rollout_ref.actor.ppo_mini_batch_size=$((TRAIN_BATCH_SIZE / 2))
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
  actor_rollout_ref.actor.use_kl_loss=True
  actor_rollout_ref.actor.kl_loss_coef=0.001
  actor_rollout_ref.actor.kl_loss_type=low_var_kl
  actor_rollout_ref.actor.entropy_coeff=0
  actor_rollout_ref.actor.fsdp_config.param_offload=False
  actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8
  actor_rollout_ref.ref.fsdp_config.param_offload=True
  actor_rollout_ref.rollout.name=sglang
  actor_rollout_ref.rollout.mode=async
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.gpu_memory_utilization=0.5
  actor_rollout_ref.rollout.n="$ROLLOUT_N"
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
  actor_rollout_ref.rollout.multi_turn.enable=True
  actor_rollout_ref.rollout.multi_turn.format=hermes
  actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5
  actor_rollout_ref.rollout.multi_turn.max_parallel_calls=1
  actor_rollout_ref.rollout.multi_turn.max_tool_response_length=512
  actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side=middle
  actor_rollout_ref.rollout.multi_turn.tool_config_path="$TOOL_CONFIG"
  actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent
  actor_rollout_ref.rollout.agent.num_workers=8
  reward.custom_reward_function.path=pkg://verl_sf.rewards
  reward.custom_reward_function.name=compute_score
  trainer.critic_warmup=0
  trainer.logger='["console"]'
  trainer.project_name=verl_sf
  trainer.experiment_name=gsm8k-sgl-multiturn-sf-tool
  trainer.n_gpus_per_node="$NGPUS"
  trainer.nnodes=1
  trainer.save_freq=-1
  trainer.test_freq=10
  trainer.val_before_train=False
  trainer.total_epochs=1
  trainer.total_training_steps="$TOTAL_STEPS"
  trainer.rollout_data_dir="$ROLLOUT_DATA_DIR"
)

cd "$ROOT"
if [ -n "${VERL_SF_CONFIG_OUT:-}" ]; then
  "$PYTHON" -m verl.trainer.main_ppo "${OVERRIDES[@]}" "$@" --cfg job >"$VERL_SF_CONFIG_OUT"
  echo "composed verl configuration: $VERL_SF_CONFIG_OUT"
else
  "$PYTHON" -m verl.trainer.main_ppo "${OVERRIDES[@]}" "$@"
  echo "rollouts: $ROLLOUT_DATA_DIR"
fi
