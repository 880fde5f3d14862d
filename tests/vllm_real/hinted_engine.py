"""vLLM's engine API with agentpark's connector, driven a request at a time over stdin.

vLLM 0.32's OpenAI server does not carry ``kv_hints`` from a request body: an envelope
reaches a request (and the connector) through the engine API only (``LLMEngine.add_request``,
``AsyncLLM.generate``), which is what an orchestrator embedding vLLM calls. The kv_hints
tests run this as a child process (``python -m tests.vllm_real.hinted_engine MODEL URL``):
it says ``{"ready": true}``, then answers each request line (JSON: ``request_id``,
``prompt``, optional ``session_id``, ``kv_hints``, ``kv_transfer_params``) with one line
once the request finished (``tokens``, ``kv_transfer_params``), and stops at EOF. vLLM
logs to stdout too: this script's lines start with :data:`MARK`.
"""

from __future__ import annotations

import json
import sys
from typing import Any

MARK = "@agentpark-test "


def _envelope(raw: dict[str, Any] | None) -> Any:
    from vllm.v1.kv_hints import KvHintAction, KvHintsEnvelope

    if raw is None:
        return None
    actions = [KvHintAction(**action) for action in raw["actions"]]
    return KvHintsEnvelope(raw["protocol_version"], raw["message_id"], actions)


def main(model: str, daemon_url: str) -> None:
    from vllm import EngineArgs, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.v1.engine.llm_engine import LLMEngine

    from agentpark.vllm_tools.launch import kv_transfer_config

    engine = LLMEngine.from_engine_args(
        EngineArgs(
            model=model,
            dtype="bfloat16",
            enforce_eager=True,
            enable_prefix_caching=False,
            max_model_len=1024,
            kv_transfer_config=KVTransferConfig(**kv_transfer_config(daemon_url)),
        )
    )
    print(MARK + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        extra = (
            {"kv_transfer_params": ask["kv_transfer_params"]}
            if "kv_transfer_params" in ask
            else None
        )
        params = SamplingParams(max_tokens=8, temperature=0.0, extra_args=extra)
        engine.add_request(
            ask["request_id"],
            ask["prompt"],
            params,
            session_id=ask.get("session_id"),
            kv_hints=_envelope(ask.get("kv_hints")),
        )
        answer: dict[str, Any] | None = None
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished and output.request_id == ask["request_id"]:
                    answer = {
                        "tokens": list(output.outputs[0].token_ids),
                        "kv_transfer_params": output.kv_transfer_params,
                    }
        # A parked turn's blocks are copied a step after it finished: step until vLLM's
        # scheduler holds nothing (its delayed frees are done, the park committed).
        scheduler = engine.engine_core.engine_core.scheduler  # the in-process core's
        while scheduler.has_requests():
            engine.step()
        print(MARK + json.dumps(answer), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
