"""``agentpark make-model``: the checkpoint transformers loads, its tokenizer and chat template."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from transformers import AutoConfig, AutoTokenizer

from agentpark.vllm_tools.model import SPECIAL_TOKENS

CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You plan trips."},
    {"role": "user", "content": "Find flights to Lisbon."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "web_search", "arguments": '{"q": "flights Lisbon"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "3 flights found"},
]

RENDERED = (
    "<|im_start|>system\nYou plan trips.<|im_end|>\n"
    "<|im_start|>user\nFind flights to Lisbon.<|im_end|>\n"
    '<|im_start|>assistant\n<tool_call>{"name": "web_search", "arguments": '
    '{"q": "flights Lisbon"}}</tool_call><|im_end|>\n'
    "<|im_start|>tool\n<tool_response>3 flights found</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
)


def _make(python: Path, directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [str(python), "-m", "agentpark", "make-model", str(directory), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)


def test_config_is_the_tiny_llama(tiny_model: Path) -> None:
    config = AutoConfig.from_pretrained(tiny_model)
    assert config.model_type == "llama"
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (64, 2, 2)
    assert config.head_dim == 32
    assert str(config.dtype).removeprefix("torch.") == "bfloat16"
    assert config.max_position_embeddings == 4096
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    assert len(tokenizer) <= config.vocab_size
    assert config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_chat_template_renders_tool_turns(tiny_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    text = tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert text == RENDERED
    # Arguments vLLM has already parsed into a dict render the same.
    parsed = json.loads(json.dumps(CONVERSATION))
    parsed[2]["tool_calls"][0]["function"]["arguments"] = {"q": "flights Lisbon"}
    again = tokenizer.apply_chat_template(parsed, tokenize=False, add_generation_prompt=True)
    assert again == RENDERED


def test_chat_template_puts_tools_in_the_system_turn(tiny_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tools = [{"type": "function", "function": {"name": "web_search", "parameters": {}}}]
    text = tokenizer.apply_chat_template(CONVERSATION[:2], tools=tools, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou plan trips.\n<tools>[{")
    assert text.count("<|im_start|>system") == 1
    assert text.endswith("<|im_start|>user\nFind flights to Lisbon.<|im_end|>\n")


def test_tokenizer_round_trips_and_keeps_special_tokens_whole(tiny_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    ids = tokenizer.encode(RENDERED, add_special_tokens=False)
    assert tokenizer.decode(ids) == RENDERED
    for token in SPECIAL_TOKENS:
        (one,) = tokenizer.encode(token, add_special_tokens=False)
        assert tokenizer.convert_ids_to_tokens(one) == token
    # Byte-level: any text encodes, none becomes an unknown token.
    odd = "naïve café 🦜 \x00\t\u2028"
    assert tokenizer.decode(tokenizer.encode(odd, add_special_tokens=False)) == odd
    # Trained on Python: common code words are single tokens.
    assert len(tokenizer.encode(" return", add_special_tokens=False)) == 1


def test_same_seed_same_bytes_other_seed_other_weights(
    vllm_python: Path, tiny_model: Path, tmp_path: Path
) -> None:
    done = _make(vllm_python, tmp_path / "again", "--seed", "0")
    assert done.returncode == 0, done.stderr
    assert "training a byte-level BPE tokenizer" in done.stderr  # progress lines
    assert "saved to" in done.stderr
    for path in sorted(tiny_model.iterdir()):
        assert (tmp_path / "again" / path.name).read_bytes() == path.read_bytes(), path.name
    other = _make(vllm_python, tmp_path / "seed1", "--seed", "1")
    assert other.returncode == 0, other.stderr
    weights = "model.safetensors"
    assert (tmp_path / "seed1" / weights).read_bytes() != (tiny_model / weights).read_bytes()
    tokenizer = "tokenizer.json"
    assert (tmp_path / "seed1" / tokenizer).read_bytes() == (tiny_model / tokenizer).read_bytes()


def test_a_non_empty_directory_is_refused(vllm_python: Path, tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    done = _make(vllm_python, tmp_path)
    assert done.returncode == 2
    assert "is not empty" in done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
