"""The shell recipes of issue 13 in dry-run mode (``RUN=echo``): which stages run, with what.

A slip in these scripts costs hours of CPU before it shows (a ``local`` that expanded an unset
variable once stopped the guarded mix at once), so their control flow is checked here without
running a single stage.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def dry_run(script: str, runs: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    knobs = ("START", "DIM", "ONLY", "STEPS", "DEVICE", "DISTILL", "DISTILL_COPIES", "M", "RESULTS", "GUARDS", "MIXES",
             "QUERY_MARKER", "MINED", "STUDENTS", "RANKING")
    environ = {k: v for k, v in os.environ.items() if k not in knobs}
    environ.update(RUN="echo", AGRAME_RUNS=str(runs), **env)
    return subprocess.run(["bash", str(ROOT / "training" / script), *args], env=environ, capture_output=True,
                          text=True, timeout=60)


def lines_with(out: str, *parts: str) -> list:
    return [line for line in out.splitlines() if all(p in line for p in parts)]


def test_scale_runs_every_stage_from_the_384d_start(tmp_path):
    result = dry_run("scale.sh", tmp_path)
    assert result.returncode == 0, result.stderr
    out, big = result.stdout, tmp_path / "big"
    students = lines_with(out, "training.student")
    assert len(students) == 2
    assert all("--init-model zero-shot --layers 6 --dim 0 --query-marker none" in s for s in students)
    assert f"--out {big}/agrame --sentence-marker Q'" in students[0]
    assert f"--out {big}/colbert --sentence-weight 0" in students[1]
    for model in ("agrame", "colbert"):
        (mix,) = lines_with(out, "training.choose_mix", f"{big}/{model}/final")
        assert "--start zero-shot " in mix and "--reference zero-shot" in mix
        assert f"--guard nq={big}/guard-nq-dev.jsonl" in mix and f"--guard trivia={big}/guard-trivia-dev.jsonl" in mix
        (interpolate,) = lines_with(out, "training.interpolate", f"--out {big}/{model}-guarded")
        assert f"choose-mix-{model}-guarded.json" in interpolate
    assert lines_with(out, "training.export", f"--out {big}/export/guarded")
    assert len(lines_with(out, "training.mined guard")) == 2


def test_scale_start_is_selectable_and_only_agrame_stops_before_the_baseline(tmp_path):
    result = dry_run("scale.sh", tmp_path, START="zero-shot-128", DIM="128", ONLY="agrame", STEPS="300",
                     QUERY_MARKER="Q")
    assert result.returncode == 0, result.stderr
    (student,) = lines_with(result.stdout, "training.student")
    assert "--init-model zero-shot-128 --layers 6 --dim 128 --query-marker Q --steps 300" in student
    assert lines_with(result.stdout, "training.choose_mix", "--start zero-shot-128")
    assert "--limit 24000" in lines_with(result.stdout, "training.mined squad")[0]  # the pool, not STEPS × 8
    longer = dry_run("scale.sh", tmp_path, STEPS="5000", ONLY="data")
    assert "--limit 40000" in lines_with(longer.stdout, "training.mined squad")[0]
    assert not lines_with(result.stdout, "colbert")


def test_scale_only_data_stops_before_any_student(tmp_path):
    result = dry_run("scale.sh", tmp_path, ONLY="data", DISTILL="1")
    assert result.returncode == 0, result.stderr
    assert len(lines_with(result.stdout, "training.mined distill")) == 3
    assert len(lines_with(result.stdout, "training.teachers")) == 5
    assert not lines_with(result.stdout, "training.student") and not lines_with(result.stdout, "choose_mix")


def test_scale_mines_from_a_ranking_made_on_the_gpu(tmp_path):
    ranked = dry_run("scale.sh", tmp_path, ONLY="data", RANKING="/r/squad-ranking.jsonl")
    (squad,) = lines_with(ranked.stdout, "training.mined squad")
    assert "--mined 4 --ranking /r/squad-ranking.jsonl" in squad and "--index" not in squad
    (indexed,) = lines_with(dry_run("scale.sh", tmp_path, ONLY="data").stdout, "training.mined squad")
    assert "--mine-model zero-shot-128 --index" in indexed and "--ranking" not in indexed


def test_scale_skips_finished_stages(tmp_path):
    big = tmp_path / "big"
    for name in ("squad.jsonl", "scifact.jsonl", "squad-labels.jsonl", "scifact-labels.jsonl",
                 "guard-nq-dev.jsonl", "guard-trivia-dev.jsonl", "agrame/final/agrame.json",
                 "export/guarded/delta.json"):
        (big / name).parent.mkdir(parents=True, exist_ok=True)
        (big / name).write_text("x\n")
    result = dry_run("scale.sh", tmp_path)
    assert result.returncode == 0, result.stderr
    commands = [line for line in result.stdout.splitlines() if line.startswith("python")]
    assert all("colbert" in c for c in commands), commands
    assert len(lines_with(result.stdout, "training.student")) == 1


def test_scale_eval_dry_run_and_unknown_model(tmp_path):
    result = dry_run("scale_eval.sh", tmp_path, "agrame", RESULTS=str(tmp_path / "results"))
    assert result.returncode == 0, result.stderr
    assert lines_with(result.stdout, "benchmarks.open_domain", f"--model {tmp_path}/big/export/guarded",
                      "--tag big-agrame-guarded")
    assert lines_with(result.stdout, "benchmarks.citation", "--tag big-agrame-guarded")
    distill = dry_run("scale_eval.sh", tmp_path, "agrame-distill", RESULTS=str(tmp_path / "results")).stdout
    assert lines_with(distill, "benchmarks.citation", f"--model {tmp_path}/big/distill/export/guarded",
                      "--tag big-agrame-distill")
    baseline = dry_run("scale_eval.sh", tmp_path, "colbert-distill", RESULTS=str(tmp_path / "results")).stdout
    assert lines_with(baseline, "benchmarks.open_domain", f"--model {tmp_path}/big/distill/colbert-guarded",
                      "--tag big-colbert-distill")
    assert not lines_with(baseline, "benchmarks.citation")  # the suite only, as for big-colbert
    bad = dry_run("scale_eval.sh", tmp_path, "nonsense")
    assert bad.returncode == 2 and "unknown model 'nonsense'" in bad.stderr


def test_scale_distill_variant_keeps_guard_questions_out_and_its_models_apart(tmp_path):
    models = tmp_path / "big" / "distill"
    result = dry_run("scale.sh", tmp_path, DISTILL="1", M=str(models))
    assert result.returncode == 0, result.stderr
    out, big = result.stdout.splitlines(), tmp_path / "big"
    for topics in ("nq-dev", "trivia-dev"):
        guard = next(i for i, line in enumerate(out) if f"mined guard --topics {topics}" in line)
        distill = next(i for i, line in enumerate(out) if f"mined distill --topics {topics}" in line)
        assert guard < distill and f"--exclude {big}/guard-{topics}.jsonl" in out[distill]
        assert lines_with(result.stdout, "teachers multivector --model zero-shot", f"distill-{topics}.jsonl")
    claims = lines_with(result.stdout, "mined distill --topics wiki-claims")
    assert len(claims) == 1 and "--exclude" not in claims[0]  # statements are no guard set's questions
    scored = " ".join(f"{big}/distill-{t}-scored.jsonl@1" for t in ("nq-dev", "trivia-dev", "wiki-claims"))
    for student in lines_with(result.stdout, "training.student"):
        assert f"{scored} --out {models}/" in student
    assert lines_with(result.stdout, "training.export", f"--out {models}/export/guarded")
    plain = dry_run("scale.sh", tmp_path).stdout
    assert not lines_with(plain, "mined distill") and not lines_with(plain, "multivector")
    assert not lines_with(plain, "-scored.jsonl")


def test_scale_mix_reuses_earlier_mixes_but_not_its_own(tmp_path):
    big = tmp_path / "big"
    (big / "first-128").mkdir(parents=True)
    (big / "first-128" / "choose-mix-agrame-guarded.json").write_text("{}\n")
    (big / "choose-mix-agrame-guarded.partial").write_text("{}\n")
    result = dry_run("scale.sh", tmp_path)
    assert result.returncode == 0, result.stderr
    (mix,) = lines_with(result.stdout, "training.choose_mix", "/agrame/final")
    assert f"--reuse {big}/first-128/choose-mix-agrame-guarded.json --out" in mix
    assert mix.count("--reuse") == 1


def test_scale_larger_guard_sets_leave_the_distill_questions_out_and_name_their_models_apart(tmp_path):
    models, big = tmp_path / "big" / "distill", tmp_path / "big"
    result = dry_run("scale.sh", tmp_path, GUARDS="2000", MIXES="0.5 0.75 1", DISTILL="1", M=str(models), ONLY="agrame")
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    for topics in ("nq-dev", "trivia-dev"):
        small = next(i for i, line in enumerate(out) if f"mined guard --topics {topics} --out" in line)
        # (a dry run prints the distill questions twice: nothing is written, so the second check finds no file)
        distill = next(i for i, line in enumerate(out) if f"mined distill --topics {topics}" in line)
        large = next(i for i, line in enumerate(out) if f"--out {big}/guard2000-{topics}.jsonl" in line)
        assert small < distill < large
        assert f"--limit 2000 --exclude {big}/distill-{topics}.jsonl" in out[large]
    (mix,) = lines_with(result.stdout, "training.choose_mix")
    assert f"--guard nq={big}/guard2000-nq-dev.jsonl" in mix and f"--guard trivia={big}/guard2000-trivia-dev.jsonl" in mix
    assert "--mix 0.5 0.75 1 --reference" in mix and f"--out {models}/choose-mix-agrame-guarded2000.json" in mix
    assert lines_with(result.stdout, "training.interpolate", f"--out {models}/agrame-guarded2000")
    assert lines_with(result.stdout, "training.export", f"--model {models}/agrame-guarded2000 --out {models}/export/guarded2000")
    # without DISTILL the same guard sets: the distill questions are still made (unscored) and left out
    plain = dry_run("scale.sh", tmp_path, GUARDS="2000", ONLY="data").stdout
    assert lines_with(plain, "mined distill --topics nq-dev") and not lines_with(plain, "multivector")
    assert lines_with(plain, f"--out {big}/guard2000-trivia-dev.jsonl")
    # the default keeps the 500-question sets' names, and no λ list
    default = dry_run("scale.sh", tmp_path, ONLY="agrame").stdout
    (mix,) = lines_with(default, "training.choose_mix")
    assert "--mix" not in mix and f"--guard nq={big}/guard-nq-dev.jsonl" in mix and not lines_with(default, "guard2000")
    bad = dry_run("scale.sh", tmp_path, GUARDS="many")
    assert bad.returncode == 2 and "GUARDS must be a positive number" in bad.stderr and not bad.stdout


def test_scale_eval_follows_the_guard_sets_into_its_tags(tmp_path):
    result = dry_run("scale_eval.sh", tmp_path, "agrame-distill", "colbert-distill", GUARDS="2000",
                     RESULTS=str(tmp_path / "results"))
    assert result.returncode == 0, result.stderr
    assert lines_with(result.stdout, "benchmarks.open_domain", f"--model {tmp_path}/big/distill/export/guarded2000",
                      "--tag big-agrame-distill-g2000")
    assert lines_with(result.stdout, "benchmarks.open_domain", f"--model {tmp_path}/big/distill/colbert-guarded2000",
                      "--tag big-colbert-distill-g2000")
    bad = dry_run("scale_eval.sh", tmp_path, "agrame", GUARDS="0")
    assert bad.returncode == 2 and "GUARDS must be a positive number" in bad.stderr


def test_e5_kd_runs_every_stage_then_skips_what_is_done(tmp_path):
    result = dry_run("e5_kd.sh", tmp_path, STEPS="50", GOLDS="0 5")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert len(lines_with(out, "training.mined", "--mine-model none", "--limit 2000")) == 1
    caches = lines_with(out, "training.e5_projection cache")
    # only the training records get (costly) teacher sentence logits, in the mode chosen on held-out train data
    assert [line.split("--sentence-mode ")[1] for line in caches] == ["none", "none", "text", "text", "none"]
    *tried, twin = lines_with(out, "training.e5_projection train")
    assert [line.split("--gold-strength ")[1].split()[0] for line in tried] == ["0", "5"]
    assert all("--steps 50" in line and "--sentence-weight" not in line for line in tried)
    [pick] = lines_with(out, "training.e5_projection pick")
    assert pick.endswith(f"--models {tmp_path}/e5kd/e5-kd-128-g0 {tmp_path}/e5kd/e5-kd-128-g5 --out {tmp_path}/e5kd/e5-kd-128")
    # the twin takes the picked model's setting (none picked yet in a dry run: the first tried)
    assert twin.endswith(f"--gold-strength 0 --sentence-weight 0 --out {tmp_path}/e5kd/e5-kd-128-psg")
    picked = tmp_path / "e5kd" / "e5-kd-128"
    picked.mkdir(parents=True)
    (picked / "pick.json").write_text("{}")
    (picked / "training.json").write_text('{"settings": {"gold_strength": 5.0}}')
    again = dry_run("e5_kd.sh", tmp_path).stdout
    assert not lines_with(again, "training.e5_projection pick")
    assert lines_with(again, "--gold-strength 5.0 --sentence-weight 0")


def test_e5_student_runs_every_stage_on_the_device_then_skips_what_is_done(tmp_path):
    result = dry_run("e5_student.sh", tmp_path, DEVICE="cuda", STEPS="40")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert len(lines_with(out, "training.mined", "--mine-model none", "--limit 2000")) == 1  # e5_kd.sh's data
    squad, nq = lines_with(out, "training.e5_teacher score")
    assert "--gold-strength 5" in squad and "--gold-strength" not in nq
    assert all("--device cuda" in line for line in (squad, nq))
    students = lines_with(out, "training.student", "--base e5-small", "--init-model e5-kd-128", "--device cuda")
    assert [line.split("--sentence-weight ")[1].split()[0] for line in students] == ["1", "0"]
    assert all("--steps 40" in line and f"{tmp_path}/e5kd/squad-e5-2000.jsonl {tmp_path}/e5kd/nq-e5-500.jsonl" in line
               for line in students)
    assert "--limit 2000" in squad and "--limit 500" in nq
    # each is chosen on held-out train questions under the pool protocol, after its pool is encoded
    for name in ("e5-student", "e5-student-psg"):
        encode = out.index(f"benchmarks.encodings --what colbert --model {tmp_path}/e5kd/{name}/final --device cuda")
        alpha = out.index(f"training.choose_alpha --model {tmp_path}/e5kd/{name}/final")
        assert encode < alpha < out.index(f"training.export --model {tmp_path}/e5kd/{name}/final")
    assert len(lines_with(out, "--protocol pool --write")) == 2
    final = tmp_path / "e5kd" / "e5-student" / "final"
    final.mkdir(parents=True)
    for name in ("agrame.json", "alpha.json"):
        (final / name).write_text("{}")
    (tmp_path / "e5kd" / "squad-e5-2000.jsonl").write_text("{}\n")
    again = dry_run("e5_student.sh", tmp_path).stdout
    assert not lines_with(again, "--gold-strength 5")
    assert [line.split("--sentence-weight ")[1].split()[0] for line in lines_with(again, "training.student")] == ["0"]
    assert len(lines_with(again, "--protocol pool")) == 1


def test_e5_student_cpu_scale_run_names_its_files_and_skips_the_twin(tmp_path):
    # The CPU-scale run of 2026-11-25: fewer records taught (their own teacher files), one student, no twin.
    out = dry_run("e5_student.sh", tmp_path, DEVICE="cpu", SQUAD="400", NQ="200", STEPS="200", BATCH="8",
                  NAME="e5-student-cpu", TWIN="0").stdout
    squad, nq = lines_with(out, "training.e5_teacher score")
    assert f"--out {tmp_path}/e5kd/squad-e5-400.jsonl --limit 400" in squad
    assert f"--out {tmp_path}/e5kd/nq-e5-200.jsonl --limit 200" in nq
    (student,) = lines_with(out, "training.student")
    assert f"--out {tmp_path}/e5kd/e5-student-cpu " in student and "--sentence-weight 1" in student
    assert "--steps 200" in student and "--batch-size 8" in student and "--device cpu" in student
    assert not lines_with(out, "e5-student-cpu-psg")


def test_gpu_students_mix_each_from_its_own_start_with_bm25_only_data(tmp_path):
    students = tmp_path / "students"
    result = dry_run("gpu_students.sh", tmp_path, STUDENTS=str(students))
    assert result.returncode == 0, result.stderr
    out, big = result.stdout, tmp_path / "big"
    (squad,) = lines_with(out, "training.mined squad")
    assert "--mined 0 --mine-model none" in squad and "--index" not in squad
    assert not lines_with(out, "training.student")  # trained elsewhere: mixed only
    for name, start in (("agrame", "zero-shot"), ("agrame128", "zero-shot-128"), ("colbert", "zero-shot")):
        (mix,) = lines_with(out, "training.choose_mix", f"--tuned {students}/gpu2100-{name} ")
        assert f"--start {start} " in mix and "--reference zero-shot" in mix
        assert f"--out {big}/gpu/choose-mix-gpu2100-{name}-guarded.json" in mix
        assert lines_with(out, "training.export", f"--out {big}/gpu/export/gpu2100-{name}-guarded")
    larger = dry_run("gpu_students.sh", tmp_path, STUDENTS=str(students), GUARDS="2000", ONLY="agrame128").stdout
    (mix,) = lines_with(larger, "training.choose_mix")
    assert f"--guard nq={big}/guard2000-nq-dev.jsonl" in mix and "gpu2100-agrame128-guarded2000" in mix
    bad = dry_run("gpu_students.sh", tmp_path, ONLY="nonsense")
    assert bad.returncode == 2 and "unknown student" in bad.stderr
    rows = dry_run("scale_eval.sh", tmp_path, "gpu-agrame128", "gpu-colbert", RESULTS=str(tmp_path / "results")).stdout
    assert lines_with(rows, "benchmarks.citation", f"--model {big}/gpu/export/gpu2100-agrame128-guarded")
    assert lines_with(rows, "benchmarks.open_domain", f"--model {big}/gpu/gpu2100-colbert-guarded", "--tag gpu-colbert")
    # the 128-d model's compressed-index rows, under the larger guard sets; a finished row is not run again
    results = tmp_path / "results"
    results.mkdir(exist_ok=True)
    (results / "index_search-latency-2b-gpu-agrame128-g2000.json").write_text("{}")
    index = dry_run("scale_eval.sh", tmp_path, "gpu-agrame128-index", GUARDS="2000", RESULTS=str(results)).stdout
    model = f"--model {big}/gpu/export/gpu2100-agrame128-guarded2000"
    for row in ("index_search build --nbits 2", "--dataset nq-oracle --first-stage agrame",
                "--dataset squad-dev --limit 2000 --first-stage agrame", "benchmarks.plaid"):
        assert lines_with(index, row, model, "--tag gpu-agrame128-g2000"), row
    assert not lines_with(index, "index_search latency")
    assert lines_with(index, "build-time --models zero-shot", f"{big}/gpu/export/gpu2100-agrame128-guarded2000")
