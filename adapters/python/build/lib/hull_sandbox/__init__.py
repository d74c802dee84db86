"""hull's adapters: the session API's client, an inspect_ai sandbox
environment (`hull_sandbox.inspect`, registered as `hull`) and a
mini-swe-agent environment (`hull_sandbox.minisweagent.HullEnvironment`).
See docs/api.md and adapters/python/README.md."""

from .client import Client, HullError, Server

__all__ = ["Client", "HullError", "Server"]
