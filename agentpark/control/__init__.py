"""The daemon's control plane for external engines: the socket server and the vLLM service."""
