"""``agrame serve``: an HTTP API and a one-page web UI over an index (the ``serve`` extra).

>>> from agrame_app.serve import create_app
>>> app = create_app("my-index")        # FastAPI; run with uvicorn, bound to 127.0.0.1
"""

from typing import Any

__all__ = ["Limits", "create_app"]


def __getattr__(name: str) -> Any:
    # lazily: the command line reads the server's settings (agrame_app.serve.http.Timeouts) without
    # the serve extra installed
    if name in __all__:
        from . import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
