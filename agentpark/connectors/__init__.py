"""Connectors: agentpark plugged into serving engines that run the model themselves.

``agentpark.connectors.vllm`` is vLLM's KV connector (``AgentparkConnector``); it talks to
the daemon over the control protocol of ``agentpark.connectors.protocol``. Nothing here
may import FastAPI or the daemon's runtime: these modules load inside vLLM's engine-core
and worker processes. Only ``agentpark.connectors.tpu`` (vLLM on TPU, loaded by the
connector's ``register_runner``) imports JAX and TPU Sync.
"""
