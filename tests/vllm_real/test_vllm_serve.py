"""``agentpark vllm serve`` against real vLLM: a make-model checkpoint serves chats through the
OpenAI SDK, vLLM gets the extra arguments unchanged and the launcher's environment, and the
fixtures' servers restart on their port and stop cleanly (no process left).

The README's quick start (its two commands, then its SDK examples against them) is
tests/vllm_real/test_quickstart.py."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import httpx
import psutil
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoTokenizer

import agentpark
from agentpark.vllm_tools.launch import ENV_DEFAULTS, SERVER_MODULE
from tests.vllm_real.conftest import PLAIN_MAX_MODEL_LEN, StartVllm, VllmServer
from tests.vllm_real.test_make_model import CONVERSATION

# Longer than one KV block (128 tokens on CPU), so a repeat finds it in the prefix cache.
LONG_CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You plan trips. " * 60},
    *CONVERSATION[1:],
]


def _chat(server: VllmServer, messages: list[dict[str, Any]], max_tokens: int = 8) -> Any:
    with OpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as client:
        (model,) = [m.id for m in client.models.list().data]
        return client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=max_tokens,
            temperature=0,
            logprobs=True,
        )


def _cache_config(server: VllmServer) -> dict[str, str]:
    text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:cache_config_info":
            (sample,) = family.samples
            return dict(sample.labels)
    raise AssertionError(f"no vllm:cache_config_info in /metrics of port {server.port}")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_plain_server_answers_a_chat_with_tool_turns(
    plain_vllm: VllmServer, tiny_model: Path
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    text = tokenizer.apply_chat_template(
        LONG_CONVERSATION, tokenize=False, add_generation_prompt=True
    )
    prompt_ids = tokenizer.encode(text, add_special_tokens=False)
    first = _chat(plain_vllm, LONG_CONVERSATION)
    # vLLM rendered the model's own chat template: the same tokens transformers makes.
    assert first.usage.prompt_tokens == len(prompt_ids) > 128
    assert first.usage.completion_tokens == len(first.choices[0].logprobs.content) == 8
    assert first.choices[0].finish_reason == "length"
    # Greedy and prefix caching on: the repeat finds whole blocks cached, same tokens.
    again = _chat(plain_vllm, LONG_CONVERSATION)
    assert again.usage.prompt_tokens_details.cached_tokens >= 128
    tokens = [t.token for t in first.choices[0].logprobs.content]
    assert [t.token for t in again.choices[0].logprobs.content] == tokens


def test_extra_args_reach_vllm_unchanged(plain_vllm: VllmServer) -> None:
    models = httpx.get(f"{plain_vllm.base_url}/models", timeout=30).json()["data"]
    assert [m["max_model_len"] for m in models] == [PLAIN_MAX_MODEL_LEN]  # not the model's 4096
    config = _cache_config(plain_vllm)
    assert config["enable_prefix_caching"] == "True"
    assert config["num_gpu_blocks_override"] == "None"


def test_launcher_execs_vllm_with_its_environment(plain_vllm: VllmServer) -> None:
    # The launcher's defaults, where this environment has none (the Makefile sets some;
    # never VLLM_CPU_NUM_OF_RESERVED_CPU, so that one is the launcher's own doing here).
    expected = {name: os.environ.get(name, value) for name, value in ENV_DEFAULTS.items()}
    root = psutil.Process(plain_vllm.pid)
    # The launcher replaced itself with vLLM: signals to this pid reach vLLM itself.
    assert root.cmdline()[1:5] == ["-m", SERVER_MODULE, "--model", str(plain_vllm.model)]
    assert "--kv-transfer-config" not in root.cmdline()  # --no-connector
    package_root = str(Path(agentpark.__file__).resolve().parent.parent)
    tree = plain_vllm.tree()
    assert len(tree) >= 2, "vLLM's engine core runs in a child process"
    # EngineCore and Worker retitle themselves (setproctitle), which blanks their
    # /proc/PID/environ; the others show what every child inherited.
    readable = [env for pid in tree if (env := psutil.Process(pid).environ())]
    assert root.environ() in readable  # the server itself is readable
    for env in readable:
        for name, value in expected.items():
            assert env.get(name) == value, name
        assert env["PYTHONPATH"].split(os.pathsep)[0] == package_root
    # What the reserved-CPU setting is for: the engine core's OpenMP set-up obeyed it.
    assert "reserve_cpu_num=1" in plain_vllm.log_path.read_text()


def test_server_options_restart_and_clean_stop(start_vllm: StartVllm, tiny_model: Path) -> None:
    server = start_vllm(tiny_model, prefix_caching=False, num_gpu_blocks=64)
    config = _cache_config(server)
    assert config["enable_prefix_caching"] == "False"
    assert config["num_gpu_blocks_override"] == "64"
    first = _chat(server, CONVERSATION)
    before = server.tree()

    server.restart()  # SIGTERM, then the same arguments on the same port
    assert all(_gone(pid) for pid in before)
    assert server.killed == [], "vLLM did not stop on SIGTERM"
    assert server.pid not in before
    again = _chat(server, CONVERSATION)
    assert again.choices[0].message.content == first.choices[0].message.content
    assert server.log_path.read_text().count("Application startup complete") == 2

    after = server.tree()
    server.stop(signal.SIGINT)  # Ctrl-C
    assert server.killed == [], "vLLM did not stop on SIGINT"
    assert all(_gone(pid) for pid in after)
