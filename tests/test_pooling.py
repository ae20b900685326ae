"""Sentence-aware token pooling (agrame.pooling) and pooled indexes: every sentence and span keeps a
vector, the vectorised clustering equals a naive one, pooled offsets come back from the tokenizer."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agrame.corpus import Passage
from agrame.index import Index, PoolFactorError, build_index, read_manifest
from agrame.index.store import Store
from agrame.pooling import (MAX_BLOCK, blocks, check_pool_factor, decode_assignment, encode_assignment,
                            member_span_mask, pool_assignment, pool_by_assignment, pooled_offsets, ward_cost)
from agrame.spans import span_token_mask
from agrame_app.cli import main


def naive_assignment(x: np.ndarray, seg: np.ndarray, factor: float) -> list:
    """Ward agglomeration by brute force: every step recomputes the cost of every pair of clusters of
    one block (a sentence's tokens, cut every MAX_BLOCK) and merges the cheapest (ties: smallest ids)."""
    block = blocks(seg)
    clusters = {i: [i] for i in range(len(seg))}
    inside = seg >= 0
    target = max(len(set(seg[inside].tolist())), math.ceil(int(inside.sum()) / factor)) if inside.any() else 0
    content = int(inside.sum())
    while content > target:
        best = None
        ids = sorted(clusters)
        for i, a in enumerate(ids):
            for b in ids[i + 1:]:
                if block[a] < 0 or block[a] != block[b]:
                    continue
                ca, cb = clusters[a], clusters[b]
                cost = (0.5 * float(((x[a] - x[b]) ** 2).sum()) if len(ca) == len(cb) == 1
                        else ward_cost(x[ca].sum(0), len(ca), x[cb].sum(0), len(cb)))
                if best is None or (cost, a, b) < best:
                    best = (cost, a, b)
        if best is None:
            break
        _, a, b = best
        clusters[a] = sorted(clusters[a] + clusters.pop(b))
        content -= 1
    out = [0] * len(seg)
    for k, first in enumerate(sorted(clusters)):
        for t in clusters[first]:
            out[t] = k
    return out


@st.composite
def passages_of_tokens(draw):
    sentences = draw(st.lists(st.integers(1, 12), min_size=1, max_size=6))
    seg = [-1, -1]  # [CLS], [D]
    for s, n in enumerate(sentences):
        seg += [s] * n
        if draw(st.booleans()):
            seg.append(-1)  # a token outside every sentence between two
    seg.append(-1)  # [SEP]
    dim = draw(st.sampled_from([2, 4, 8]))
    seed = draw(st.integers(0, 2 ** 16))
    x = np.random.default_rng(seed).normal(size=(len(seg), dim))
    return x / np.linalg.norm(x, axis=1, keepdims=True), np.array(seg), draw(st.sampled_from([1, 1.5, 2, 3, 4, 16]))


@settings(max_examples=200, deadline=None)
@given(passages_of_tokens())
def test_pooling_equals_a_naive_ward_and_keeps_every_sentence(case):
    x, seg, factor = case
    assignment = pool_assignment(x, seg, factor)
    assert assignment.tolist() == naive_assignment(x, seg, factor)
    m = int(assignment.max()) + 1
    owners = [set(seg[assignment == v].tolist()) for v in range(m)]
    assert all(len(o) == 1 for o in owners), "a vector pools tokens of two sentences"
    assert all((assignment == v).sum() == 1 for v, o in enumerate(owners) if o == {-1}), "a protected token was pooled"
    kept = {next(iter(o)) for o in owners}
    assert set(seg[seg >= 0].tolist()) <= kept, "a sentence lost every vector"
    content = sum(1 for o in owners if o != {-1})
    assert content == max(len(set(seg[seg >= 0].tolist())), math.ceil(int((seg >= 0).sum()) / factor))
    firsts = [int(np.flatnonzero(assignment == v)[0]) for v in range(m)]
    assert firsts == sorted(firsts), "vectors are numbered by their first token"
    assert decode_assignment(encode_assignment(assignment)).tolist() == assignment.tolist()


def test_long_sentences_are_pooled_in_blocks_whose_codes_fit_a_byte():
    rng = np.random.default_rng(0)
    seg = np.array([-1] + [0] * 700 + [-1])
    x = rng.normal(size=(len(seg), 4))
    assignment = pool_assignment(x, seg, 16)
    codes = encode_assignment(assignment)
    assert codes.dtype == np.uint8 and decode_assignment(codes).tolist() == assignment.tolist()
    assert int(assignment.max()) + 1 == 2 + math.ceil(700 / 16)
    block = blocks(seg)
    assert len(set(block[1:-1].tolist())) == math.ceil(700 / MAX_BLOCK)
    assert all(len(set(block[assignment == v].tolist())) == 1 for v in range(int(assignment.max()) + 1))


def test_pool_by_assignment_is_the_normalised_mean_and_differentiable():
    x = torch.randn(7, 5, requires_grad=True)
    assignment = np.array([0, 1, 2, 1, 3, 2, 4])
    out = pool_by_assignment(x, assignment)
    want = torch.stack([x[0], x[[1, 3]].mean(0), x[[2, 5]].mean(0), x[4], x[6]])
    assert torch.allclose(out, torch.nn.functional.normalize(want, dim=-1), atol=1e-6)
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    offsets = torch.tensor([[0, 0], [0, 3], [4, 6], [6, 9], [10, 12], [12, 13], [0, 0]])
    assert pooled_offsets(offsets, assignment).tolist() == [[0, 0], [0, 9], [4, 13], [10, 12], [0, 0]]
    assert encode_assignment(assignment).tolist() == [0, 0, 0, 2, 0, 2, 0]  # 1: the newest vector, 2: one before
    # vector 2 holds tokens 2 and 5 (characters 4-6 and 12-13): its characters run 4-13, but a span of
    # 7-11 holds none of its tokens, only tokens 3 and 4 (vectors 1 and 3)
    assert member_span_mask(offsets, assignment, [(7, 11)]).tolist() == [[False, True, False, True, False]]
    assert span_token_mask(pooled_offsets(offsets, assignment), [(7, 11)]).tolist() == \
        [[False, True, True, True, False]]  # (what the characters alone would say)


@pytest.mark.parametrize("bad", ["0", "0.5", "-2", "two", "nan", "inf", "17", "", True, None])
def test_bad_pool_factors(bad):
    with pytest.raises(ValueError, match="pool factor must be a number from 1 to 16"):
        check_pool_factor(bad)
    assert check_pool_factor("2") == 2 and check_pool_factor(2.5) == 2.5


WORDS = ["coral", "reef", "bleach", "ocean", "warm", "algae", "fish", "storm", "wave", "sand", "a", "b"]


@st.composite
def texts(draw):
    sentences = draw(st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=9), min_size=1, max_size=5))
    return " ".join(" ".join(words).capitalize() + "." for words in sentences)


@pytest.fixture(scope="module")
def long_encoder(make_tiny_encoder):
    return make_tiny_encoder(doc_maxlen=96)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(texts(), min_size=1, max_size=6), st.sampled_from([2, 3, 4]))
def test_no_sentence_of_a_pooled_index_is_left_without_a_vector(tmp_path_factory, long_encoder, docs, factor):
    path = tmp_path_factory.mktemp("pooled") / "ix"
    passages = [Passage(f"p{i}", text) for i, text in enumerate(docs)]
    build_index(long_encoder, passages, path, pool_factor=factor, progress=False)
    manifest = read_manifest(path)
    assert manifest["pool_factor"] == factor and manifest["num_tokens"] <= manifest["num_original_tokens"]
    index = Index(path, model=long_encoder)
    corpus = index.store.corpus(np.arange(len(passages)))
    sentences_held = set(corpus.token_sentence[corpus.token_sentence >= 0].tolist())
    assert sentences_held == set(range(corpus.sentences.shape[0]))
    # every sentence is an answer: a sentence search over all of them scores each one (none is -inf)
    hits = index.search("coral reef", granularity="sentence", top_k=None, exact=True)
    assert len(hits) == corpus.sentences.shape[0] and all(math.isfinite(h.score) for h in hits)


def test_pooled_offsets_from_the_tokenizer_equal_stored_ones(tmp_path, long_encoder):
    passages = [Passage("a", "Coral reefs bleach in warm water. Fish leave. Storms break the reef apart."),
                Passage("b", "A. Sand and algae cover the dead coral within a year or two of the bleaching.")]
    build_index(long_encoder, passages, tmp_path / "tok", pool_factor=3, progress=False)
    from agrame.index.writer import build_compressed

    build_compressed(long_encoder, passages, tmp_path / "kept", pool_factor=3, progress=False, store_offsets=True)
    recomputed = Store(tmp_path / "tok", tokenize=long_encoder.passage_offsets).corpus(np.arange(2))
    stored = Store(tmp_path / "kept").corpus(np.arange(2))
    assert torch.equal(recomputed.offsets, stored.offsets)
    assert torch.equal(recomputed.token_sentence, stored.token_sentence)
    for p in (0, 1):  # the members spans are told by: from the tokenizer, or from tokens.bin
        assert torch.equal(recomputed.pool_members[p][0], stored.pool_members[p][0])
        assert np.array_equal(recomputed.pool_members[p][1], stored.pool_members[p][1])
    full = long_encoder.encode_passages([p.text for p in passages])
    assert recomputed.num_tokens < sum(len(e.offsets) for e in full)
    # each pooled vector covers one run of tokens: its characters are from the first's start to the last's end
    store = Store(tmp_path / "tok")
    assert len(store.pool_codes) == sum(len(e.offsets) for e in full) == int(store.origlens.sum())
    assignments = [decode_assignment(store.pool_codes[store.orig_starts[p]:store.orig_starts[p + 1]]) for p in (0, 1)]
    assert torch.equal(recomputed.offsets, torch.cat([pooled_offsets(e.offsets, a) for e, a in zip(full, assignments)]))
    # the one-word sentence "A." keeps its own vector
    b = recomputed.passage_tokens(1)
    assert ((recomputed.offsets[b, 0] == 0) & (recomputed.offsets[b, 1] >= 1) & (recomputed.offsets[b, 1] <= 2)).any()


def test_a_span_that_cuts_a_cluster_is_scored_by_the_clusters_it_overlaps(tmp_path, long_encoder):
    text = "Warming ocean waters cause coral bleaching in which stressed corals expel their algae."
    passage = Passage("a", text, spans=((0, 4), (27, 32), ((6, 13), (60, 66)), (0, len(text))))
    build_index(long_encoder, [passage], tmp_path / "ix", pool_factor=4, progress=False)
    index = Index(tmp_path / "ix", model=long_encoder)
    hits = index.search("coral bleaching", granularity="span", top_k=None, exact=True)
    assert len(hits) == 4 and all(math.isfinite(h.score) for h in hits)
    corpus = index.store.corpus(np.arange(1))
    _, q = index.encode_query("coral bleaching", "span")  # the span side's query vectors
    sim = q @ corpus.vectors.T
    masks = corpus.span_mask(0, list(passage.spans))
    members, assignment = corpus.pool_members[0]
    assert torch.equal(masks, member_span_mask(members, assignment, list(passage.spans)))
    for hit in hits:
        k = [tuple(map(tuple, p)) for p in (((s,) if isinstance(s[0], int) else s) for s in passage.spans)].index(
            tuple(map(tuple, hit.pieces)))
        want = sim.masked_fill(~masks[k].unsqueeze(0), float("-inf")).amax(-1).sum()
        assert hit.span_score == pytest.approx(float(want), rel=1e-5, abs=1e-5)
    # (0, 4) cuts "Warming": the one cluster holding that token scores it, whatever else it holds
    assert int(masks[0].sum()) == 1 and int(assignment[(members[:, 0] == 0) & (members[:, 1] > 0)][0]) == \
        int(masks[0].nonzero()[0])


def test_add_upsert_compact_keep_the_factor(tmp_path, long_encoder):
    first = [Passage(f"p{i}", f"Coral reef number {i} bleached. Fish left it in year {i}.") for i in range(6)]
    path = tmp_path / "ix"
    build_index(long_encoder, first, path, pool_factor=2, progress=False)
    index = Index(path, model=long_encoder)
    index.add([Passage("new", "Storms broke the reef. Sand covered it.")])
    with pytest.raises(PoolFactorError, match="pool factor 2.*not with 3"):
        index.add([Passage("other", "Nothing.")], pool_factor=3)
    index.upsert([Passage("p1", "The algae came back. The reef recovered slowly over ten years.")])
    index.delete(["p0", "p2"], compact_threshold=0.1)
    manifest = read_manifest(path)
    assert manifest["pool_factor"] == 2 and "tombstones" not in manifest
    store = index.store
    assert len(store.pool_codes) == int(store.origlens.sum()) == manifest["num_original_tokens"]
    rebuilt = tmp_path / "rebuilt"
    live = [Passage(r["id"], r["text"]) for r in (store.record(int(p)) for p in store.live_positions())]
    build_index(long_encoder, live, rebuilt, pool_factor=2, progress=False, codec=store.codec)
    assert np.array_equal(np.asarray(Store(rebuilt).pool_codes), np.asarray(store.pool_codes))
    # a compacted pooled index answers as a fresh pooled build of its live passages
    ours = index.search("reef recovered", granularity="sentence", top_k=None, exact=True)
    fresh = Index(rebuilt, model=long_encoder).search("reef recovered", granularity="sentence", top_k=None, exact=True)
    assert [(h.passage_id, h.start, h.end, round(h.score, 4)) for h in ours] == \
        [(h.passage_id, h.start, h.end, round(h.score, 4)) for h in fresh]


def test_cli_pool_factor(tmp_path, capsys, coral_file, tiny_model_dir):
    ix = tmp_path / "ix"
    for bad in ("0", "0.9", "two", "17"):
        with pytest.raises(SystemExit) as exit_:
            main(["index", "-p", str(coral_file), "-i", str(ix), "-m", str(tiny_model_dir), "--pool-factor", bad])
        assert exit_.value.code == 2
        assert "pool factor must be a number from 1 to 16" in capsys.readouterr().err
    assert not ix.exists()
    assert main(["index", "-p", str(coral_file), "-i", str(ix), "-m", str(tiny_model_dir), "--pool-factor", "2"]) == 0
    assert read_manifest(ix)["pool_factor"] == 2
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in ix.rglob("*") if p.is_file() and p.name != ".lock"}
    assert main(["index", "--add", "-p", str(coral_file), "-i", str(ix), "--pool-factor", "3"]) == 2
    err = capsys.readouterr().err
    assert "pool factor 2" in err and "not with 3" in err
    assert {p.name: p.read_bytes() for p in ix.rglob("*") if p.is_file() and p.name != ".lock"} == before
    assert main(["index", "--upsert", "-p", str(coral_file), "-i", str(ix), "--pool-factor", "2"]) == 0
    assert main(["index", "-p", str(coral_file), "-i", str(tmp_path / "v1"), "-m", str(tiny_model_dir),
                 "--format", "1", "--pool-factor", "2"]) == 2
    assert "--pool-factor needs a compressed index" in capsys.readouterr().err
    assert main(["search", "-i", str(ix), "-g", "sentence", "-f", "jsonl", "-k", "1", "coral"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["passage_id"]


def test_an_index_from_before_pooling_opens_as_factor_one(tmp_path, capsys):
    from test_default_model import LEGACY_ZERO_SHOT

    ix = tmp_path / "old"
    shutil.copytree(LEGACY_ZERO_SHOT, ix)
    assert "pool_factor" not in read_manifest(ix)
    assert Store(ix).pool_factor == 1 and Store(ix).pool_codes is None
    extra = tmp_path / "extra.jsonl"
    extra.write_text(json.dumps({"id": "new", "text": "Sea grass meadows store carbon."}) + "\n")
    assert main(["index", "--add", "-p", str(extra), "-i", str(ix), "--pool-factor", "2"]) == 2
    assert "pool factor 1" in capsys.readouterr().err
    assert main(["index", "--add", "-p", str(extra), "-i", str(ix), "--pool-factor", "1"]) == 0
    assert "pool_factor" not in read_manifest(ix)


# -- pooling-aware training (training.student --pool-factor) ------------------------------------------


@pytest.mark.parametrize("factor", [2, 3])
def test_a_pooling_student_scores_what_a_pooled_index_would(marked_encoder, factor):
    from agrame.ranker import Ranker
    from test_training import assert_scores_equal_ranker, record
    from agrame.training.student import StudentScorer

    batch = [record("why do reefs bleach", [0, 1, 2]), record("who built the tower in 1889", [2, 3, 0])]
    scorer = StudentScorer(marked_encoder, "Q'", pool_factor=factor).eval()
    with torch.no_grad():
        passage, sentence, mask = scorer(batch)
    ranker = Ranker(marked_encoder, alpha=0.0)
    for b, r in enumerate(batch):
        full = ranker.encode([Passage(str(k), p["text"]) for k, p in enumerate(r["passages"])])  # Punkt, as the records
        corpus = full.pooled(factor)
        assert corpus.num_tokens < full.num_tokens
        assert_scores_equal_ranker(ranker, corpus, r, passage[b], sentence[b], mask[b])


def test_a_pooled_corpus_holds_the_vectors_a_pooled_index_stores(tmp_path, long_encoder):
    from agrame.ranker import Ranker

    passages = [Passage("a", "Coral reefs bleach in warm water. Fish leave. Storms break the reef apart."),
                Passage("b", "Sand and algae cover the dead coral within a year or two of the bleaching.")]
    from agrame.index.writer import build_compressed

    build_compressed(long_encoder, passages, tmp_path / "ix", pool_factor=2, progress=False, store_offsets=True)
    pooled = Ranker(long_encoder).encode(passages).pooled(2)
    stored = Store(tmp_path / "ix").corpus(np.arange(2))
    assert torch.equal(pooled.offsets, stored.offsets) and torch.equal(pooled.token_sentence, stored.token_sentence)


def test_a_pooling_student_step_keeps_every_tensor_on_the_encoders_device(make_tiny_encoder, monkeypatch):
    # The meta device has no values to cluster: the host copy the clusters are chosen on is stood in for by
    # random values of its shape; everything else (the means, the masks, the loss, backward) runs under
    # the mode that refuses an operation mixing devices.
    import agrame.training.student as student
    from test_training import record
    from test_training_scale import OneDeviceMode, _meta_student
    from agrame.training.losses import MultiGranularKLLoss

    monkeypatch.setattr(student, "_host", lambda v: torch.randn(v.shape) if v.device.type == "meta" else v.cpu())
    encoder = _meta_student(make_tiny_encoder)
    batch = [record("reefs", [0, 1, 2]), record("tower", [2, 3, 0])]
    optimizer = torch.optim.AdamW(student.trainable_parameters(encoder, layers=1), lr=1e-4)
    scorer = student.StudentScorer(encoder, "Q'", in_batch=True, pool_factor=2)
    with OneDeviceMode():
        value = student.make_loss(scorer, MultiGranularKLLoss())(batch)
        value.backward()
        optimizer.step()
    assert value.device.type == "meta" and value.shape == ()


def test_a_model_carries_its_pool_factor_and_search_budgets_into_the_indexes_built_with_it(tmp_path, long_encoder):
    from agrame.encoder import EncoderSettings, ModelError

    assert "pool_factor" not in long_encoder.settings.to_json() and "search" not in long_encoder.settings.to_json()
    shipped = long_encoder.with_settings(pool_factor=2, search={"nprobe": 4, "ncandidates": 256, "per_hit": 3})
    assert shipped.fingerprint() == long_encoder.fingerprint()  # the vectors are the model's either way
    passages = [Passage("a", "Coral reefs bleach in warm water. Fish leave."), Passage("b", "Sand covers it.")]
    build_index(shipped, passages, tmp_path / "own", progress=False)
    manifest = read_manifest(tmp_path / "own")
    assert manifest["pool_factor"] == 2 and manifest["search"] == {"nprobe": 4, "ncandidates": 256, "per_hit": 3}
    assert tuple(Index(tmp_path / "own", model=shipped).defaults) == (4, 256, 3)
    build_index(shipped, passages, tmp_path / "told", pool_factor=1, progress=False)
    assert "pool_factor" not in read_manifest(tmp_path / "told")
    for bad in ({"pool_factor": 0}, {"search": {"nprobe": 0}}, {"search": {"depth": 3}}):
        with pytest.raises(ModelError):
            EncoderSettings.from_json({**long_encoder.settings.to_json(), **bad})
