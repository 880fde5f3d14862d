"""Engines agentpark parks KV for: adapter protocol, block allocator, reference model."""

from agentpark.blocks import ArraySpec, BlockAllocator, PoolExhaustedError, PoolGeometry
from agentpark.engine.base import EngineAdapter
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
