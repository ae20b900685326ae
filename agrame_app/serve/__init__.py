"""``agrame serve``: an HTTP API and a one-page web UI over an index (the ``serve`` extra).

>>> from agrame_app.serve import create_app
>>> app = create_app("my-index")        # FastAPI; run with uvicorn, bound to 127.0.0.1
"""

from .app import Limits, create_app

__all__ = ["Limits", "create_app"]
