"""Issue 61: a lent GPU used to the last second. The batched clustering (pooling-aware training on a device)
against agrame.pooling's host clustering on random inputs, and on another device than the CPU under the mode
that refuses mixed devices; bfloat16 autocast against float32 on a small model; the deadline schedule; the
bundle's per-model pool factor, its one-run lock and its thread budget."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agrame.pooling import BatchPlan, batch_pool, batch_pool_assignment, pool_assignment, pool_by_assignment
from agrame.training import precision
from training import bundle
from training.bundle import BundleError
from agrame.training.loop import LoopSettings, schedule_factor, train
from agrame.training.losses import MultiGranularKLLoss
from agrame.training.student import StudentScorer, make_loss, pool_padded, pool_padded_on_device, trainable_parameters

from test_training import record
from test_training_scale import OneDeviceMode, _meta_student


def _passage(rng, dim: int, longest: int = 40, duplicates: bool = False):
    """One passage's unit token vectors and sentences: [CLS] and [D] protected, sentences of 1..longest
    tokens with protected tokens between some, [SEP]; with ``duplicates``, some tokens repeat another's vector
    exactly (equal costs: the tie-break decides)."""
    seg = [-1, -1]
    for s in range(int(rng.integers(1, 7))):
        seg += [s] * int(rng.integers(1, longest + 1))
        if rng.random() < 0.3:
            seg.append(-1)
    seg.append(-1)
    x = rng.normal(size=(len(seg), dim))
    if duplicates:
        for _ in range(4):
            a, b = rng.integers(0, len(seg), 2)
            x[a] = x[b]
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32), np.array(seg)


def _batch(cases, pad: int = 3):
    width = max(len(s) for _, s in cases) + pad
    vectors = torch.zeros(len(cases), width, cases[0][0].shape[1])
    segments = torch.full((len(cases), width), -1, dtype=torch.long)
    for b, (x, s) in enumerate(cases):
        vectors[b, :len(s)] = torch.from_numpy(x)
        segments[b, :len(s)] = torch.from_numpy(s)
    return vectors, segments


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2 ** 16), dim=st.sampled_from([2, 8, 128]), factor=st.sampled_from([1, 1.5, 2, 3, 4, 16]),
       duplicates=st.booleans(), passages=st.integers(1, 9))
def test_the_batched_clustering_equals_the_hosts_on_random_passages(seed, dim, factor, duplicates, passages):
    rng = np.random.default_rng(seed)
    cases = [_passage(rng, dim, duplicates=duplicates) for _ in range(passages)]
    vectors, segments = _batch(cases)
    plan = BatchPlan([s for _, s in cases], factor, dim)
    assignment = batch_pool_assignment(vectors, plan)
    pooled, sentences = batch_pool(vectors, assignment, plan.counts, segments)
    for b, (x, s) in enumerate(cases):
        host = pool_assignment(x, s, factor)
        assert assignment[b, :len(s)].tolist() == host.tolist()
        assert (assignment[b, len(s):] == -1).all() and plan.counts[b] == int(host.max()) + 1
        reference = pool_by_assignment(torch.from_numpy(x), host)
        assert torch.allclose(pooled[b, :len(reference)], reference, atol=1e-6)
        assert not pooled[b, len(reference):].any()  # zeros past the passage's vectors, as pad_sequence's
        first = [int(np.flatnonzero(host == v)[0]) for v in range(len(reference))]
        assert sentences[b, :len(first)].tolist() == s[first].tolist()


def test_long_sentences_take_the_hosts_gram_costs_and_block_cuts():
    # 190 and 300 tokens at d = 128: past the direct form's size (the Gram form there) and past MAX_BLOCK (255)
    rng = np.random.default_rng(1)
    cases = []
    for length in (190, 300, 20, 260):
        seg = np.array([-1] + [0] * length + [1] * 15 + [-1])
        x = rng.normal(size=(len(seg), 128))
        cases.append(((x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32), seg))
    vectors, _ = _batch(cases)
    for factor in (2, 4):
        plan = BatchPlan([s for _, s in cases], factor, 128)
        assert plan.gram.any() and not plan.gram[2].any()
        assignment = batch_pool_assignment(vectors, plan)
        for b, (x, s) in enumerate(cases):
            assert assignment[b, :len(s)].tolist() == pool_assignment(x, s, factor).tolist()


def test_the_batched_clustering_reads_nothing_back_and_stays_on_one_device():
    # the meta device has no values: a read back (.item(), a branch on a value) fails there, and the mode
    # refuses any operation that mixes it with a CPU tensor — what a GPU would refuse
    segments = [np.array([-1, 0, 0, 0, 1, 1, -1]), np.array([-1, 0, 0, -1])]
    plan = BatchPlan(segments, 2, 8)
    vectors = torch.randn(2, 7, 8, device="meta", requires_grad=True)
    with OneDeviceMode():
        assignment = batch_pool_assignment(vectors, plan)
        pooled, sentences = batch_pool(vectors, assignment, plan.counts,
                                       torch.full((2, 7), -1, dtype=torch.long, device="meta"))
        pooled.sum().backward()
    assert assignment.device.type == pooled.device.type == sentences.device.type == "meta"
    assert tuple(pooled.shape) == (2, max(plan.counts), 8) and vectors.grad.shape == vectors.shape


def _padded_docs(rng, b=2, n_p=3, dim=8):
    """Padded passages [B, P, W, d] with a scored-token mask that has holes (punctuation) and sentence ids."""
    cases = [_passage(rng, dim, longest=12) for _ in range(b * n_p)]
    width = max(len(s) for _, s in cases) + 4
    docs = torch.zeros(b * n_p, width, dim)
    mask = torch.zeros(b * n_p, width, dtype=torch.bool)
    seg = torch.full((b * n_p, width), -1, dtype=torch.long)
    for i, (x, s) in enumerate(cases):
        docs[i, :len(s)] = torch.from_numpy(x)
        mask[i, :len(s)] = torch.from_numpy(rng.random(len(s)) > 0.15)
        seg[i, :len(s)] = torch.where(mask[i, :len(s)], torch.from_numpy(s), torch.full((len(s),), -1))
    return docs.reshape(b, n_p, width, dim), mask.reshape(b, n_p, width), seg.reshape(b, n_p, width)


@pytest.mark.parametrize("factor", [1.5, 2, 4])
def test_a_step_pooled_on_the_device_is_the_step_pooled_on_the_host(factor):
    docs, mask, seg = _padded_docs(np.random.default_rng(7))
    docs.requires_grad_(True)
    host_docs, host_mask, host_seg = pool_padded(docs, mask, seg, factor)
    dev_docs, dev_mask, dev_seg, check = pool_padded_on_device(docs, mask, seg, factor, check=True)
    assert check["identical"] == check["passages"] == 6 and check["device_s"] >= 0
    assert torch.equal(dev_mask, host_mask) and torch.equal(dev_seg, host_seg)
    assert torch.allclose(dev_docs, host_docs, atol=1e-6)
    (grad_host,) = torch.autograd.grad(host_docs.pow(2).sum() + host_docs.sum(), docs)
    (grad_dev,) = torch.autograd.grad(dev_docs.pow(2).sum() + dev_docs.sum(), docs)
    assert torch.allclose(grad_host, grad_dev, atol=1e-5)  # the means stay differentiable, the same way


def test_a_pooling_aware_student_step_keeps_every_tensor_on_the_encoders_device(make_tiny_encoder):
    # the device path of a pooled student (the CPU's takes the host clustering): one whole step on the meta
    # device under the mode that refuses mixed devices
    encoder = _meta_student(make_tiny_encoder)
    batch = [record("reefs", [0, 1, 2]), record("tower", [2, 3, 0])]
    optimizer = torch.optim.AdamW(trainable_parameters(encoder, layers=1), lr=1e-4)
    scorer = StudentScorer(encoder, "Q'", in_batch=True, pool_factor=2)
    with OneDeviceMode():
        passage, sentence, mask = scorer(batch)
        value = make_loss(scorer, MultiGranularKLLoss())(batch)
        value.backward()
        optimizer.step()
    assert passage.device.type == sentence.device.type == mask.device.type == "meta"
    assert value.shape == () and not scorer.pooling_check  # (checks read values back: on CUDA only)


def test_a_bf16_step_matches_float32_within_tolerance(make_tiny_encoder):
    """bfloat16 autocast of the backbone (float32 master weights, float32 vectors out): one step's loss within
    1 % of float32's, the whole gradient within 5 % (relative norm of the difference; measured: 0.02 % and
    0.5 %) and each tuned tensor's of any size within cosine 0.98 of float32's (bfloat16 keeps 8 bits of
    mantissa: ~0.4 % a value). On the CPU here; CUDA's autocast runs the same graph."""
    batch = [record(q, order) for q, order in (("why do reefs bleach", [0, 1, 2]), ("the tower", [2, 3, 0]),
                                               ("what fish do", [3, 0, 1]))]
    results = {}
    for mode in ("fp32", "bf16"):
        torch.manual_seed(0)
        encoder = make_tiny_encoder(doc_maxlen=64, query_maxlen=8, seed=3).with_settings(
            markers={"Q": "[unused0]", "Q'": "[unused2]", "D": "[unused1]"}, span_query_marker="Q'")
        assert precision.apply(encoder, "cpu", mode) == mode
        params = trainable_parameters(encoder, layers=2)
        scorer = StudentScorer(encoder, "Q'", in_batch=True).eval()  # (no dropout: the same graph twice)
        loss = make_loss(scorer, MultiGranularKLLoss())(batch)
        loss.backward()
        results[mode] = (float(loss.detach()), [p.grad.clone() for p in params])
    (loss32, grads32), (loss16, grads16) = results["fp32"], results["bf16"]
    assert loss16 == pytest.approx(loss32, rel=1e-2)
    flat32, flat16 = torch.cat([g.flatten() for g in grads32]), torch.cat([g.flatten() for g in grads16])
    assert (flat16 - flat32).norm() / flat32.norm() < 0.05
    largest = max(float(g.norm()) for g in grads32)
    for a, b in zip(grads32, grads16):
        if a.norm() > 1e-3 * largest:  # (a key bias's gradient is zero but for rounding: no direction to keep)
            assert torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0) > 0.98


def test_the_encoder_in_bf16_gives_float32_unit_vectors(make_tiny_encoder):
    encoder = make_tiny_encoder(doc_maxlen=64)
    ids = torch.randint(1000, 2000, (2, 12))
    mask = torch.ones_like(ids)
    reference = encoder(ids, mask)
    assert encoder.with_settings().compute_dtype is None
    precision.apply(encoder, "cpu", "bf16")
    assert encoder.with_settings(doc_maxlen=32).compute_dtype == torch.bfloat16  # (settings changes keep it)
    mixed = encoder(ids, mask)
    assert mixed.dtype == torch.float32 and torch.allclose(mixed.norm(dim=-1), torch.ones(2, 12), atol=1e-5)
    assert torch.nn.functional.cosine_similarity(mixed, reference, dim=-1).min() > 0.99
    precision.apply(encoder, "cpu", "auto")  # the CPU's default: unchanged
    assert encoder.compute_dtype is None and torch.equal(encoder(ids, mask), reference)


def test_precision_choices():
    assert precision.resolve("cuda") == precision.resolve("cuda:1") == "bf16"
    assert precision.resolve("cpu") == precision.resolve("meta") == "fp32"
    assert precision.resolve("cuda", "fp32") == "fp32" and precision.resolve("cpu", "bf16") == "bf16"
    with pytest.raises(ValueError, match="precision must be one of"):
        precision.resolve("cpu", "fp16")


def test_the_memory_cap_names_the_gpu_by_index(monkeypatch):
    """``--device cuda`` (no index) reached torch's cap as ``torch.device("cuda")``, which it refuses: both
    students of the first lent H200 call died before their first step. torch's own index check stands in
    for the GPU here."""
    from torch.cuda._utils import _get_device_index
    capped = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, device=None: capped.append((fraction, _get_device_index(device))))
    precision.limit_memory("cuda", 0.475)
    precision.limit_memory("cuda:1", 0.5)
    precision.limit_memory("cpu", 0.5)
    precision.limit_memory("cuda", None)
    assert capped == [(0.475, 0), (0.5, 1)]


def test_the_time_schedule_warms_up_then_decays_to_zero():
    assert schedule_factor(0.0, 0.05) == pytest.approx(0.02)  # the first step is not at lr 0
    assert schedule_factor(0.025, 0.05) == pytest.approx(0.5) and schedule_factor(0.05, 0.05) == pytest.approx(1.0)
    assert schedule_factor(0.525, 0.05) == pytest.approx(0.5) and schedule_factor(1.0, 0.05) == 0.0
    assert schedule_factor(1.5, 0.05) == 0.0


def test_a_deadline_run_trains_until_the_deadline_and_saves_inside_it(tmp_path, make_tiny_encoder):
    # a device call's student: no step count known in advance, the schedule on the time, no checkpoints,
    # the final model written before the deadline
    examples = [record(q, [0, 1, 2]) for q in ("reefs", "bleach", "tower", "fish", "water", "build")]
    enc = make_tiny_encoder(doc_maxlen=64, query_maxlen=8, seed=3)
    scorer = StudentScorer(enc, "Q'")
    deadline = time.time() + 4.0
    result = train(scorer, examples, make_loss(scorer, MultiGranularKLLoss()),
                   LoopSettings(steps=10 ** 6, batch_size=2, lr=1e-3, warmup=0.1, checkpoint_every=0, log_every=1,
                                deadline=deadline, save_seconds=1.0),
                   tmp_path, params=trainable_parameters(enc, 1), save=lambda path: enc.save(path))
    finished = time.time()
    assert result["done"] and result["step"] > 5 and finished <= deadline
    assert (tmp_path / "final" / "agrame.json").exists() and not (tmp_path / "checkpoint.pt").exists()
    lrs = [float(line.split(" lr ")[1].split()[0]) for line in (tmp_path / "train.log").read_text().splitlines()
           if " lr " in line]
    peak = lrs.index(max(lrs))
    assert max(lrs) <= 1e-3 and lrs[-1] < 0.25 * max(lrs)  # warmed up, then decayed almost to 0 at the end
    assert all(a >= b for a, b in zip(lrs[peak:], lrs[peak + 1:]))
    with pytest.raises(ValueError, match="no time to train"):
        train(scorer, examples, make_loss(scorer, MultiGranularKLLoss()),
              LoopSettings(steps=10, batch_size=2, deadline=time.time() + 0.5, save_seconds=1.0),
              tmp_path / "late", params=trainable_parameters(enc, 1))


def test_student_names_carry_their_own_pool_factor():
    assert bundle.model_spec("agrame128") == bundle.MODELS["agrame128"][:1] + (list(bundle.MODELS["agrame128"][1]),)
    start, args = bundle.model_spec("agrame128-pool2")
    assert start == "zero-shot-128" and args == list(bundle.MODELS["agrame128"][1]) + ["--pool-factor", "2"]
    assert bundle.model_spec("colbert-pool1.5")[1][-2:] == ["--pool-factor", "1.5"]
    for bad, message in (("agrame128-pool0", "pool factor must be"), ("agrame128-pool1", "is agrame128 itself"),
                         ("nope-pool2", "unknown model"), ("agrame128-pool99", "pool factor must be")):
        with pytest.raises(BundleError, match=message):
            bundle.model_spec(bad)


def test_a_second_run_on_the_machine_is_refused_naming_the_first(tmp_path):
    lock = tmp_path / "run.lock"
    first = bundle._exclusive(lock)
    try:
        with pytest.raises(BundleError, match=r"another bundle run is on this machine \(pid \d+"):
            bundle._exclusive(lock)
    finally:
        first.close()
    bundle._exclusive(lock).close()  # free again once the first is done


def test_threads_past_the_cores_are_refused():
    bundle.check_threads(8, 2, cores=16)
    bundle.check_threads(None, 6, cores=16)
    with pytest.raises(BundleError, match="--threads 8 × 3 processes side by side = 24 threads on 16 cores"):
        bundle.check_threads(8, 3, cores=16)


def test_a_students_summary_comes_from_its_log_and_settings(tmp_path):
    (tmp_path / "final").mkdir()
    (tmp_path / "train.log").write_text(
        "2026-11-28 10:00:00,000 step 10 loss 1.2500 lr 1.00e-04 gpu_peak_gb 21.5\n"
        "2026-11-28 10:00:02,000 step 20 loss 1.0000 lr 5.00e-05 gpu_peak_gb 22.0\n"
        "2026-11-28 10:00:02,500 done at step 23 (2.5 s of training, the deadline's)\n")
    (tmp_path / "final" / "training.json").write_text(json.dumps(
        {"pool_factor": 2, "precision": "bf16", "pooling_check": [{"passages": 512, "identical": 512}]}))
    summary = bundle.student_summary(tmp_path, 64)
    assert summary == {"steps": 23, "question_steps": 23 * 64, "training_s": 2.5, "last_loss": 1.0, "gpu_peak_gb": 22.0,
                       "seconds_per_step": 0.2, "pool_factor": 2, "precision": "bf16",
                       "pooling_check": [{"passages": 512, "identical": 512}]}
    assert bundle.student_deadline(100.0, 540.0, 2) == 100.0 + 540.0 - 2 * bundle.PACK_SECONDS - bundle.REPORT_SECONDS


def test_the_clustering_benchmark_times_a_batch_and_checks_it_against_the_host(tmp_path):
    from benchmarks.pool_batch import main, measure, synthetic_passages

    cases = synthetic_passages(3, 16, seed=1)
    assert all(100 <= len(s) <= 256 and s[0] == s[1] == s[-1] == -1 for _, s in cases)
    result = measure("cpu", passages=3, dim=16, repeats=1)
    assert result["identical"] == 3 and len(result["repeats"]) == 1 and result["target_s"] == 0.15
    main(["--device", "cpu", "--passages", "2", "--dim", "8", "--repeats", "1", "--out", str(tmp_path / "r.json")])
    assert json.loads((tmp_path / "r.json").read_text())["identical"] == 2


@pytest.mark.parametrize("bad, message", [(["--memory-fraction", "1.5"], "--memory-fraction 1.5"),
                                          (["--checkpoint-every", "-1"], "0 or more"),
                                          (["--precision", "fp16"], "invalid choice")])
def test_bad_device_options_exit_2_before_anything_is_read(bad, message, tmp_path, capsys):
    from agrame.training.student import main

    with pytest.raises(SystemExit) as stop:
        main(["--data", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "run"), *bad])
    assert stop.value.code == 2 and message in capsys.readouterr().err and not (tmp_path / "run").exists()
