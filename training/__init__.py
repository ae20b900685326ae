"""Training: data, teachers, losses (nn.Modules), a resumable loop, the student and its export.

- ``data``: SQuAD v1.1 train → questions, gold paragraph, BM25 hard negatives, sentences.
- ``teachers``: passage CE, ``$``-marked sentence CE' and a one-pass CE (passage + sentences).
- ``losses``: the multi-granular KL loss (L_psg + Σ w_i L_s), SupCon for the SubEncoder.
- ``loop``: deterministic, resumable optimisation with checkpoints and a log file.
- ``student``: AGRaME's multi-vector student and its ablations; ``export``: a model as a delta over MiniLM.
- (the Sub-Sentence Encoder baseline is ``benchmarks.subencoder``: only the atomic-facts benchmark uses it)
"""
