"""RAG quick start: index a folder of text files, retrieve sentences for a question, cite an answer.

    python examples/rag_quickstart.py [FOLDER] [--question Q] [--answer A] [--index DIR]

Defaults: the text files in examples/docs, a question about Marie Curie, and the answer in
examples/curie_answer.txt (in a real pipeline, your LLM writes it from the retrieved sentences).
With ``pip install "agrame[langchain]"`` the same index also serves as a LangChain retriever.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from agrame import Passage, load_encoder
from agrame.index import Index, build_index
from propcite import cite

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", nargs="?", default=str(HERE / "docs"), help="folder of .txt files (one passage each)")
    parser.add_argument("--question", default="Where was Marie Curie born and what did she discover?")
    parser.add_argument("--answer", default=(HERE / "curie_answer.txt").read_text().strip())
    parser.add_argument("--index", default=None, help="index folder to write (default: a temporary one)")
    parser.add_argument("--model", default=None, help="model (default: the package default)")
    args = parser.parse_args()

    # 1. Index: each text file is a passage whose id is its file name.
    files = sorted(Path(args.folder).glob("*.txt"))
    if not files:
        raise SystemExit(f"{args.folder}: no .txt files")
    passages = [Passage(f.stem, f.read_text(encoding="utf-8").strip()) for f in files]
    encoder = load_encoder(args.model)
    index_dir = Path(args.index or tempfile.mkdtemp(prefix="agrame-rag-")) / "index"
    build_index(encoder, passages, index_dir, overwrite=True)
    index = Index(index_dir, model=encoder)
    print(f"indexed {len(passages)} passages from {args.folder} into {index_dir}\n")

    # 2. Retrieve sentences (not whole passages) for the question: the context an LLM would get.
    print(f"Q: {args.question}")
    hits = index.search(args.question, "sentence", top_k=4)
    for rank, hit in enumerate(hits, 1):
        print(f"  {rank}. [{hit.passage_id} {hit.start}-{hit.end}] {hit.text}  (score {hit.score:.2f})")

    # 3. Cite the answer: each proposition of each sentence is attributed to the passages that
    #    support it (PropCite), here the passages the retrieval returned.
    retrieved = list(dict.fromkeys(h.passage_id for h in hits))
    result = cite(args.answer, [Passage(pid, index.get(pid)["text"]) for pid in retrieved], model=encoder)
    print(f"\nA: {result.text}")
    for n, pid in enumerate(retrieved, 1):
        print(f"   [{n}] {pid}")
    for sentence in result.sentences:
        for prop in sentence.propositions:
            source = retrieved[prop.passage] if prop.passage is not None else "no support found"
            print(f"   - {prop.text!r} → {source}")


if __name__ == "__main__":
    main()
