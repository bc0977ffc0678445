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
    finish (for up to config.shutdown_timeout seconds, then cancel them) and return. Call it on the main
    thread, the one that built `llm`: the engine is stepped there and HTTP is served on a second thread
    (engine_loop.py says why)."""
    import threading

    import uvicorn

    from treeflash.server.app import build_app

    app = build_app(llm, config, engine_thread=False)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=access_log,
                                           timeout_graceful_shutdown=config.shutdown_timeout, lifespan="on"))
    logging.getLogger("treeflash.server").setLevel(log_level.upper())
    engine, failed = app.state.engine_loop, []

    def http() -> None:
        try:
            server.run()  # (on this thread uvicorn installs no signal handlers: the main thread's below act)
        except BaseException as e:  # noqa: BLE001 (a port in use ends uvicorn with SystemExit: say so on main)
            failed.append(e)
        finally:
            engine.stop()  # (a no-op after the lifespan's own stop; the engine's thread returns from run)

    def on_signal(signum, frame) -> None:
        # As uvicorn's own handler: the first signal shuts down gracefully, a second Ctrl-C at once (the
        # engine ends after its current step; a third Ctrl-C interrupts that step too).
        if server.should_exit and signum == signal.SIGINT:
            server.force_exit = True
            signal.signal(signal.SIGINT, signal.default_int_handler)
        server.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    thread = threading.Thread(target=http, name="treeflash-http")
    thread.start()
    engine.run()
    thread.join()
    # A signal while the interpreter exits, when Python handlers are already gone, must not turn the
    # finished shutdown into death by signal: exit 0.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    if failed:
        raise failed[0]
