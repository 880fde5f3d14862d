"""Engines agentpark parks KV for: adapter protocol, block allocator, reference model."""

from agentpark.engine.base import ArraySpec, EngineAdapter, PoolGeometry
from agentpark.engine.pool import BlockAllocator, PoolExhaustedError
from agentpark.engine.reference import ModelSpec, PoolSpec, ReferenceEngine
from agentpark.engine.sampling import sample

__all__ = [
    "ArraySpec",
    "BlockAllocator",
    "EngineAdapter",
    "ModelSpec",
    "PoolExhaustedError",
    "PoolGeometry",
    "PoolSpec",
    "ReferenceEngine",
    "sample",
]
