"""verl's ToolAgentLoop driven as a trainer drives it, with a scripted policy and a byte tokenizer
built here (no downloads): shared by the verl tool tests and the session tool tests."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import hydra
import verl
from omegaconf import OmegaConf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry
from verl.experimental.agent_loop.tool_agent_loop import AgentData, ToolAgentLoop
from verl.experimental.agent_loop.tool_parser import FunctionCall
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse
from verl.tools.tool_registry import load_all_tools
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput

from verl_sf.tools import SandboxFusionTool

CHAT_TEMPLATE = """{%- if tools %}<|im_start|>system
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' %}<|im_start|>assistant
{{ message.content }}
{%- for call in message.tool_calls or [] %}<tool_call>{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}</tool_call>{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A real HF fast tokenizer (one token per byte, Qwen-style specials), built without downloads."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<|endoftext|>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHAT_TEMPLATE)


TOKENIZER = byte_tokenizer()


class ScriptedPolicy(LLMServerClient):
    """The language model's stand-in: answers turn i with `turns[i]` (text, then EOS)."""

    def __init__(self, config: Any, turns: list[str]):
        super().__init__(config, load_balancer_handle=None)
        self.turns = turns
        self.prompts: list[str] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> TokenOutput:
        self.prompts.append(TOKENIZER.decode(prompt_ids))
        text = self.turns[len(self.prompts) - 1]
        return TokenOutput(token_ids=TOKENIZER.encode(text) + [TOKENIZER.eos_token_id], stop_reason="completed")


def trainer_config(tool_config_path: str, max_tool_response_length: int = 256) -> Any:
    """verl's own default trainer config with multi-turn tool calling switched on."""
    path = Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml"
    cfg = OmegaConf.load(path)
    multi_turn = cfg.actor_rollout_ref.rollout.multi_turn
    multi_turn.enable = True
    multi_turn.tool_config_path = tool_config_path
    multi_turn.format = "hermes"
    multi_turn.max_assistant_turns = 5
    multi_turn.max_tool_response_length = max_tool_response_length
    cfg.actor_rollout_ref.rollout.prompt_length = 4096
    cfg.actor_rollout_ref.rollout.response_length = 8192
    return cfg


def build_loop(cfg: Any, tools: list, turns: list[str] = ()) -> tuple[ToolAgentLoop, ScriptedPolicy]:
    """As AgentLoopWorker does: hydra-instantiate the registered `tool_agent` loop."""
    policy = ScriptedPolicy(cfg, list(turns))
    loop = hydra.utils.instantiate(config=_agent_loop_registry["tool_agent"], trainer_config=DictConfigWrap(cfg),
                                   server_manager=policy, tokenizer=TOKENIZER, processor=None, hf_model_type=None,
                                   dataset_cls=RLHFDataset, data_config=DictConfigWrap(cfg.data),
                                   tools=ToolListWrap(tools))
    return loop, policy


def agent_data() -> AgentData:
    return AgentData(messages=[], image_data=None, video_data=None, audio_data=None, mm_processor_kwargs=None,
                     metrics={}, request_id=uuid.uuid4().hex, tools_kwargs={})


def tool_call(code: str, **extra: Any) -> FunctionCall:
    return FunctionCall(name="code_interpreter", arguments=json.dumps({"code": code, **extra}))


def write_tool_config(tmp_path: Path, **config: Any) -> str:
    """A tool yaml like configs/sandbox_fusion_tool_config.yaml with `config` overrides."""
    base = OmegaConf.load(Path(__file__).parents[1] / "configs/sandbox_fusion_tool_config.yaml")
    for key, value in config.items():
        base.tools[0].config[key] = value
    path = tmp_path / f"tool-{uuid.uuid4().hex[:8]}.yaml"
    OmegaConf.save(base, path)
    return str(path)


class VerlHarness:
    """A tool loaded by verl's `load_all_tools` and the ToolAgentLoop that calls it."""

    def __init__(self, tool_config_path: str, max_tool_response_length: int = 100_000, tool: Any = None):
        self.path = tool_config_path
        self.cfg = trainer_config(tool_config_path, max_tool_response_length)
        (self.tool,) = [tool] if tool is not None else load_all_tools(tool_config_path, None)
        assert isinstance(self.tool, BaseTool) and isinstance(self.tool, SandboxFusionTool)
        self.loop, _ = build_loop(self.cfg, [self.tool])

    async def call(self, code: str, data: AgentData | None = None, **extra: Any) -> tuple[ToolResponse, Any, dict]:
        return await self.loop._call_tool(tool_call(code, **extra), {}, data or agent_data())

    async def close(self) -> None:
        await self.tool.close()
