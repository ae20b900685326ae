"""The LangChain and LlamaIndex retrievers through their frameworks' public interfaces (the real
langchain-core and llama-index-core), over an index folder and over a running agrame serve."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from agrame.index import build_index

from test_lifecycle import _passages

QUERY = "coral bleaching"


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory, tiny_encoder):
    path = tmp_path_factory.mktemp("integrations") / "ix"
    build_index(tiny_encoder, _passages(12), path)
    return path


@pytest.fixture(scope="module")
def server(index_dir, tiny_model_dir):
    import uvicorn

    from agrame_app.serve import create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_app(str(index_dir), model=str(tiny_model_dir))
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.time() + 60
    while not srv.started:
        assert time.time() < deadline, "agrame serve did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(10)


def _check_metadata(meta, granularity, text):
    assert meta["granularity"] == granularity and isinstance(meta["score"], float)
    a, b = meta["best_sentence"]
    assert a < b and meta["start"] <= meta["end"]
    if granularity == "sentence":
        assert [meta["start"], meta["end"]] == meta["best_sentence"]
        assert meta["doc_id"] == f"{meta['passage_id']}#{meta['start']}:{meta['end']}"
    else:
        assert meta["doc_id"] == meta["passage_id"] and a >= meta["start"] and b <= meta["end"]
    assert text


@pytest.mark.parametrize("granularity", ["passage", "sentence"])
def test_langchain_retriever_over_a_folder(index_dir, tiny_model_dir, granularity):
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever

    from agrame.index import Index
    from agrame.integrations.langchain import AgrameRetriever

    retriever = AgrameRetriever.from_index(index_dir, model=str(tiny_model_dir), granularity=granularity, top_k=4)
    assert isinstance(retriever, BaseRetriever)
    docs = retriever.invoke(QUERY)
    assert len(docs) == 4 and all(isinstance(d, Document) for d in docs)
    want = Index(index_dir, model=str(tiny_model_dir)).search(QUERY, granularity, top_k=4)
    assert [(d.metadata["passage_id"], d.page_content) for d in docs] == [(h.passage_id, h.text) for h in want]
    for d in docs:
        _check_metadata(d.metadata, granularity, d.page_content)
        assert d.metadata["metadata"]["source"] in ("wiki", "news")  # the passage's own metadata
    # the async path answers alike; its query is encoded on another thread, whose matrix products may round
    # in another order (seen: scores one float32 ulp apart on one machine, equal on another)
    again = [d.metadata for d in asyncio.run(retriever.ainvoke(QUERY))]
    assert [{k: v for k, v in m.items() if k != "score"} for m in again] == \
        [{k: v for k, v in d.metadata.items() if k != "score"} for d in docs]
    assert [m["score"] for m in again] == pytest.approx([d.metadata["score"] for d in docs], rel=1e-6)
    # filters pass through, and batch works as LangChain runnables do
    only = AgrameRetriever.from_index(index_dir, model=str(tiny_model_dir), granularity=granularity, top_k=4,
                                      filter={"source": "wiki"})
    assert {d.metadata["metadata"]["source"] for d in only.invoke(QUERY)} == {"wiki"}
    assert len(retriever.batch([QUERY, "tower"])) == 2


def test_langchain_retriever_over_agrame_serve(server, index_dir, tiny_model_dir):
    from agrame.integrations.langchain import AgrameRetriever

    remote = AgrameRetriever.from_index(server, granularity="sentence", top_k=3).invoke(QUERY)
    local = AgrameRetriever.from_index(index_dir, model=str(tiny_model_dir), granularity="sentence",
                                       top_k=3).invoke(QUERY)
    assert [(d.metadata["doc_id"], round(d.metadata["score"], 4)) for d in remote] == \
        [(d.metadata["doc_id"], round(d.metadata["score"], 4)) for d in local]
    # the passage's own metadata over the wire too (it was always {} from a URL)
    assert [d.metadata["metadata"] for d in remote] == [d.metadata["metadata"] for d in local]
    assert all(d.metadata["metadata"]["source"] in ("wiki", "news") for d in remote)
    # the same exception type from a URL as from a folder
    from agrame.index import FilterError

    for where in (server, index_dir):
        with pytest.raises(FilterError, match="bogus"):
            AgrameRetriever.from_index(where, model=None if where == server else str(tiny_model_dir),
                                       filter={"$bogus": 1}).invoke(QUERY)
    with pytest.raises(FilterError, match="answered 400"):
        AgrameRetriever.from_index(server, filter={"$bogus": 1}).invoke(QUERY)


@pytest.mark.parametrize("where", ["folder", "server"])
def test_llama_index_retriever(where, server, index_dir, tiny_model_dir):
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import MetadataMode, NodeWithScore

    from agrame.integrations.llama_index import AgrameRetriever

    source = server if where == "server" else index_dir
    retriever = AgrameRetriever(source, model=None if where == "server" else str(tiny_model_dir),
                                granularity="passage", top_k=5)
    assert isinstance(retriever, BaseRetriever)
    nodes = retriever.retrieve(QUERY)
    assert len(nodes) == 5 and all(isinstance(n, NodeWithScore) for n in nodes)
    assert [n.score for n in nodes] == sorted((n.score for n in nodes), reverse=True)
    for n in nodes:
        _check_metadata(n.node.metadata, "passage", n.node.get_content())
        assert "best_sentence" not in n.node.get_content(metadata_mode=MetadataMode.LLM)
    again = asyncio.run(retriever.aretrieve(QUERY))
    assert [n.node.node_id for n in again] == [n.node.node_id for n in nodes]
