"""Tools around vLLM: ``agentpark make-model`` (a small local checkpoint) and ``agentpark
vllm serve`` (vLLM started with agentpark's KV connector). Nothing here imports vLLM, torch
or transformers at import time: they come from the optional extra ``agentpark[vllm]``.
"""

__all__: list[str] = []
