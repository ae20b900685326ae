"""Retrievers for RAG frameworks over an index folder or a running ``agrame serve``:

- :class:`agrame.integrations.langchain.AgrameRetriever` (``pip install "agrame[langchain]"``)
- :class:`agrame.integrations.llama_index.AgrameRetriever` (``pip install "agrame[llamaindex]"``)

Both return, per hit, the unit's text (a passage, sentence or span) and metadata: ``passage_id``,
``score``, ``granularity``, ``start``/``end`` (characters in the passage), ``best_sentence`` (the
passage's best sentence for the query, ``[start, end]``), ``doc_id`` (the run-file id,
:mod:`agrame.runs`) and the passage's own ``metadata`` (over an index folder; ``agrame serve``'s
``/search`` does not return it, so over a URL it is empty).
"""

from ._source import Hit, SearchSource, open_source

__all__ = ["Hit", "SearchSource", "open_source"]
