"""The embedded OpenAI-compatible server on the simulated engine (`topas serve --engine sim`).

Light at import: FastAPI/uvicorn load only when a server is built. See docs/server.md.
"""

from __future__ import annotations

from topas_agents._lazy import lazy_getattr

_LAZY = {
    "ServerConfig": "topas_agents.server.config",
    "ServerHandle": "topas_agents.server.runner",
    "start_server_in_thread": "topas_agents.server.runner",
    "run_server": "topas_agents.server.runner",
    "build_app": "topas_agents.server.app",
    "register_responder": "topas_agents.server.responders",
    "EchoResponder": "topas_agents.server.responders",
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY)
