"""A LangChain retriever over an AGRaME index folder or a running ``agrame serve``.

    from agrame.integrations.langchain import AgrameRetriever
    retriever = AgrameRetriever.from_index("my-index", granularity="sentence", top_k=5)
    docs = retriever.invoke("What causes coral bleaching?")        # or await retriever.ainvoke(…)
    docs[0].metadata  # passage_id, score, granularity, start, end, best_sentence, doc_id, metadata

``pip install "agrame[langchain]"`` (``langchain-core``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

try:
    from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
except ImportError as exc:  # pragma: no cover - exercised by users without the extra
    raise ImportError('the LangChain retriever needs langchain-core: pip install "agrame[langchain]"') from exc
from pydantic import ConfigDict

from ._source import SearchSource, open_source


class AgrameRetriever(BaseRetriever):
    """Passages, sentences or spans of an AGRaME index as LangChain ``Document``s, best first."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    source: SearchSource
    granularity: str = "sentence"
    top_k: int = 5
    filter: Optional[Dict[str, Any]] = None

    @classmethod
    def from_index(cls, index: Union[str, Path], *, model=None, api_key: Optional[str] = None,
                   **kwargs) -> "AgrameRetriever":
        """``index``: an index folder, or the URL of ``agrame serve`` (``http://host:port``)."""
        return cls(source=open_source(index, model=model, api_key=api_key), **kwargs)

    def _documents(self, query: str) -> List[Document]:
        return [Document(page_content=h.text, metadata=h.to_metadata(), id=h.doc_id)
                for h in self.source.search(query, self.granularity, self.top_k, self.filter)]

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> List[Document]:
        return self._documents(query)

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun) -> List[Document]:
        # Search is CPU-bound torch work (or a blocking HTTP call): off the event loop.
        return await asyncio.to_thread(self._documents, query)
