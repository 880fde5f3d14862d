"""Connectors: agentpark plugged into serving engines that run the model themselves.

``agentpark.connectors.vllm`` is vLLM's KV connector (``AgentparkConnector``); it talks to
the daemon over the control protocol of ``agentpark.connectors.protocol``. Nothing here
may import JAX, FastAPI or the daemon's runtime: these modules load inside vLLM's
engine-core and worker processes.
"""
