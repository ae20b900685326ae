"""A LlamaIndex retriever over an AGRaME index folder or a running ``agrame serve``.

    from agrame.integrations.llama_index import AgrameRetriever
    retriever = AgrameRetriever("my-index", granularity="sentence", top_k=5)
    nodes = retriever.retrieve("What causes coral bleaching?")     # or await retriever.aretrieve(…)
    nodes[0].score, nodes[0].node.metadata["best_sentence"]

``pip install "agrame[llamaindex]"`` (``llama-index-core``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

try:
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
except ImportError as exc:  # pragma: no cover - exercised by users without the extra
    raise ImportError('the LlamaIndex retriever needs llama-index-core: pip install "agrame[llamaindex]"') from exc

from ._source import SearchSource, open_source


class AgrameRetriever(BaseRetriever):
    """Passages, sentences or spans of an AGRaME index as ``NodeWithScore``s, best first."""

    def __init__(self, index: Union[str, Path, SearchSource], *, granularity: str = "sentence", top_k: int = 5,
                 filter: Optional[Dict[str, Any]] = None, model=None, api_key: Optional[str] = None, **kwargs):
        self.source = open_source(index, model=model, api_key=api_key)
        self.granularity, self.top_k, self.filter = granularity, top_k, filter
        super().__init__(**kwargs)

    def _nodes(self, query: str) -> List[NodeWithScore]:
        out = []
        for h in self.source.search(query, self.granularity, self.top_k, self.filter):
            # Only the passage id and span go into the text the LLM sees; the rest stays out of it.
            node = TextNode(id_=h.doc_id, text=h.text, metadata=h.to_metadata(),
                            excluded_llm_metadata_keys=["score", "best_sentence", "doc_id", "start", "end",
                                                        "granularity", "metadata"],
                            excluded_embed_metadata_keys=["score", "best_sentence", "doc_id", "start", "end",
                                                          "granularity", "metadata"])
            out.append(NodeWithScore(node=node, score=h.score))
        return out

    def _retrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        return self._nodes(query_bundle.query_str)

    async def _aretrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        return await asyncio.to_thread(self._nodes, query_bundle.query_str)
