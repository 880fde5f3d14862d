"""agentpark: park an idle agent's KV cache off the accelerator, restore it bit-exact."""

__version__ = "0.1.0"
__all__ = ["__version__"]
