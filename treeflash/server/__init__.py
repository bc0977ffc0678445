"""`treeflash serve`: an OpenAI-compatible HTTP server over one long-lived engine.

`app.py` holds the routes, `protocol.py` the wire format, `frontend.py` the translation of a request
body into validated engine requests, `engine_loop.py` the one thread that steps the engine, and
`metrics.py` the Prometheus metrics.
"""

from __future__ import annotations

import logging
import signal

from treeflash.server.frontend import ServerConfig

__all__ = ["ServerConfig", "serve"]


def serve(llm, config: ServerConfig, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
          access_log: bool = False) -> None:
    """Serve `llm` until SIGINT or SIGTERM; then stop taking connections, let the requests in flight
    finish (for up to config.shutdown_timeout seconds, then cancel them) and return."""
    import uvicorn

    from treeflash.server.app import build_app

    app = build_app(llm, config)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=access_log,
                                           timeout_graceful_shutdown=config.shutdown_timeout, lifespan="on"))
    logging.getLogger("treeflash.server").setLevel(log_level.upper())
    # uvicorn handles SIGINT/SIGTERM gracefully, then raises the signal again for the handler it found
    # installed. With SIG_IGN found, that echo (and a repeated signal while the interpreter exits, when
    # Python handlers are already gone) cannot turn the finished shutdown into death by signal: exit 0.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    server.run()
