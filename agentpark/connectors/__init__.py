"""Connectors: agentpark plugged into serving engines that run the model themselves.

``agentpark.connectors.vllm`` is vLLM's KV connector (``AgentparkConnector``), a facade
over the scheduler side (``scheduler``) and the worker side (``worker``, whose copies are
``torch_copies`` over the mapped ``pool``, or ``tpu`` through TPU Sync); they talk to the
daemon over the control protocol of ``protocol`` (with ``client``), and a step's plan is
``steps``. Nothing here may load the daemon (FastAPI, SQLAlchemy, the runtime, parking,
dma, engine): these modules run inside vLLM's engine-core and worker processes
(tests/connectors/test_light_imports.py walks every one). Only ``tpu`` and what it shares
with the daemon's tpu_sync backend (``tpu_sync_manager``) import JAX, and only vLLM on
TPU loads them (the worker's ``register_runner``).
"""
