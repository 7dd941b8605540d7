import collections
import dataclasses
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
import time

import pytest

import mech

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "figures"))
import experiments  # noqa: E402
from figures import collect, drawing, sweeps  # noqa: E402
from figures.paper import PAPER  # noqa: E402

SCRIPT = os.path.join("figures", "experiments.py")
# mech.py flags given with --sweep apply to every run: these make each run a few seconds long
TINY = ["--steps", "6", "--d-model", "8", "--num-kv", "64", "--n-train", "64", "--n-eval", "16",
        "--eval-every", "3", "--scan", "ref"]


# the same for ATR, whose sweep atr-attention-nope has only 2 runs; each test adds its --steps
ATR_TINY = ["--d-model", "8", "--n-train", "64", "--n-eval", "16", "--no-interventions"]


def parse(run):
    return mech.config_from_args(mech.build_parser().parse_args(sweeps.run_args(run)))


def processes_in(folder) -> list:
    """The pids of the live processes whose command line names folder (a sweep and its runs)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(folder).encode() in f.read():  # a zombie's is empty
                    pids.append(int(pid))
        except OSError:  # it ended meanwhile
            pass
    return pids


def record(folder, accuracy, **fields):
    """A record as collect makes it from a run folder, of the run Config(**fields)."""
    return dict(dataclasses.asdict(mech.Config(**fields)), folder=folder, accuracy=accuracy,
                dev_accuracy=None, wall_time_s=1.0)


def table_rows(table):
    """The cells of a summary table's rows (not its header, nor the notes under it)."""
    first = table.split("\n\n")[0]  # the summary; a table of the watched runs may follow
    return [line.split(" | ") for line in first.splitlines()[2:] if line.startswith("| ")]


def fake_run(folder, attribs, n_docs=None, **fields):
    """A run folder as mech.py writes it, its Key-corrupted rows' Attribs given by attribs,
    {(site, layer, position): attrib} (0 elsewhere); with n_docs, the rows of a newer analysis: each
    row's n, fewer documents at Value+1 / Value+2 (where they are distinct). Its stored "main" is
    deliberately wrong (@Key 1): collect must read the rows themselves."""
    cfg = mech.Config(**fields)
    rows = [dict(corrupted="key", site=site, layer=layer, position=p, p_clean=0.9, p_corr=0.1,
                 attrib=attribs.get((site, layer, p), 0.0),
                 **({"n": n_docs - 40 * ("+" in p)} if n_docs else {}))
            for site in ("block_input", "mixer_output", "conv_output") for layer in range(cfg.n_layer)
            for p in mech.POSITIONS]
    interventions = dict(rows=rows, main=dict.fromkeys(mech.POSITIONS, 0.0) | {"key": 1.0},
                         **({"n_docs": n_docs} if n_docs else {}))
    os.makedirs(folder)
    mech.save(os.path.join(folder, "config.json"), dataclasses.asdict(cfg))
    mech.save(os.path.join(folder, "metrics.json"),
                    dict(accuracy=0.8, test_loss=1.0, wall_time_s=1.0, interventions=interventions,
                         curve=[dict(step=10, train_loss=0.5, test_loss=1.0, accuracy=0.8)]))


# ── enumeration ──────────────────────────────────────────────────────────────────────────────

def test_paper_grids():
    runs = sweeps.sweep_runs("ar-main", "paper", 1)
    cells = collections.Counter((r["arch"], r["d_model"], r["lr"]) for _, r in runs)
    assert len(runs) == 5 * 5 + 6 * 5 * 7 == len(cells)  # attention: LR5; the others LR7; d in 16..256
    assert {d for _, d, _ in cells} == {16, 32, 64, 128, 256}
    assert {lr for a, _, lr in cells if a == "attention"} == set(sweeps.LR5)
    assert {lr for a, _, lr in cells if a == "mamba"} == {3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2}
    assert all(r["seed"] == 42 for _, r in runs)
    cfg = parse(runs[0][1])  # the paper's protocol: 16 epochs of 100,032 documents
    assert cfg.total_steps == 50_016 and cfg.schedule == "cosine" and cfg.num_kv == 8192
    dconv = sweeps.sweep_runs("ar-dconv", "paper", 1)
    assert len(dconv) == 5 * 5 * 7 and {parse(r).d_conv for _, r in dconv} == {0, 1, 2, 3, 4}
    atr = sweeps.sweep_runs("atr-main", "paper", 2)
    assert len(atr) == 3 * 7 * 5 * 5 * 2
    cfgs = [parse(r) for _, r in atr[:: 50]]
    assert all(c.task == "atr" and c.total_steps == 100_032 for c in cfgs)
    based = {(parse(r).arch, parse(r).d_conv, parse(r).long_conv) for _, r in sweeps.sweep_runs("ar-based-conv", "paper", 1)}
    assert based == {("based", k, False) for k in (1, 2, 3, 4)} | {("based", 3, True), ("base_conv", 3, True)}


def test_cpu_scale_uses_the_presets_with_seeds():
    runs = sweeps.sweep_runs("ar-main", "cpu", 3)
    assert len(runs) == 7 * 3 and len({name for name, _ in runs}) == 21
    cfgs = [parse(r) for _, r in runs]
    assert {c.seed for c in cfgs} == {42, 43, 44}
    assert all(c.d_model == 64 for c in cfgs)
    mamba = next(c for c in cfgs if c.arch == "mamba")
    assert mamba.fresh_data and mamba.lr == 3e-3  # the per-architecture CPU recipe applies
    assert len(sweeps.sweep_runs("atr-mamba-dconv", "cpu", 3)) == 15
    layers = {(parse(r).arch, parse(r).n_layer) for _, r in sweeps.sweep_runs("ar-layers", "cpu", 1)}
    # 2 layers come from ar-main; a 1-layer Based would be the 1-layer BaseConv
    assert layers == {(a, n) for a in sweeps.ARCHS for n in (1, 3)} - {("based", 1)}
    nope = sweeps.sweep_runs("atr-attention-nope", "cpu", 1)  # a False flag is named and passed as --no-...
    assert [name for name, _ in nope] == ["atr_easy_attention_nope_s42", "atr_medium_attention_nope_s42"]
    assert all(parse(r).pos_emb is False for _, r in nope)


def test_variants_name_the_departures_from_the_papers_main_runs():
    base = dict(task="atr", atr="easy", n_layer=2, d_model=64, lr=1e-3, long_conv=False, seed=42, accuracy=0.5)
    recs = [dict(base, arch="attention", d_conv=None, pos_emb=True), dict(base, arch="attention", d_conv=None, pos_emb=False),
            dict(base, arch="mamba", d_conv=4, pos_emb=False), dict(base, arch="mamba", d_conv=0, pos_emb=False),
            dict(base, arch="based", d_conv=3, pos_emb=True, long_conv=True)]
    names = ["attention", "attention NoPE", "mamba", "mamba d_conv 0", "based long conv PE"]
    assert [r["arch"] + collect.conv_variant(r) + collect.pe_variant(r) for r in recs] == names
    assert sorted(row[1] for row in table_rows(collect.summary_table(recs))) == sorted(names)


@pytest.mark.parametrize("args, needle", [
    (["--sweep", "foo"], "'foo'"), (["--sweep", "ar-main", "--scale", "huge"], "'huge'"),
    (["--sweep", "ar-main", "--seeds", "0", "--print-commands"], "--seeds"), (["--sweep", "ar-main", "--jobs", "0", "--print-commands"], "--jobs"),
    (["--sweep", "ar-main", "--lr", "-1", "--print-commands"], "-1"), (["--collect", "/nonexistent/dir"], "/nonexistent/dir"),
    # mech.py's flags pass through to the runs, checked as mech.py checks them; each run has its own --out
    (["--sweep", "ar-main", "--steps", "abc", "--print-commands"], "'abc'"),
    (["--sweep", "ar-main", "--no-such-flag", "--print-commands"], "--no-such-flag"),
    (["--sweep", "ar-main", "--out", "x", "--print-commands"], "--out"),
    (["--collect", "/tmp", "--steps", "5"], "--steps"), ([], "--sweep"),
])
def test_bad_sweep_values(capsys, args, needle):
    with pytest.raises(SystemExit) as e:
        experiments.main(args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err and err.startswith("experiments.py: error: "), err


# ── running: printed commands, resumption, collection, figures ───────────────────────────────

def test_printed_commands_run(tmp_path, capsys):
    experiments.main(["--sweep", "ar-dconv", "--seeds", "1", "--print-commands", "--sweep-dir", str(tmp_path), *TINY])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 5
    for line in lines[:2]:  # each line is a whole command: run it as a scheduler would
        cmd = shlex.split(line)
        assert cmd[:2] == ["python", "mech.py"]
        r = subprocess.run([sys.executable, *cmd[1:], "--threads", "1"], cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        out = cmd[cmd.index("--out") + 1]
        assert re.fullmatch(r"ar_mamba_dconv\d_s42_x[0-9a-f]{8}", os.path.basename(out))  # TINY's hash
        with open(os.path.join(out, "metrics.json")) as f:
            assert "interventions" in json.load(f)


def test_printing_into_a_reader_that_stops_early_is_not_an_error():
    # `python figures/experiments.py --sweep ar-main --scale paper --print-commands | head -1`
    p = subprocess.Popen([sys.executable, SCRIPT, "--sweep", "ar-main", "--scale", "paper", "--print-commands"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=120) == 0 and first.startswith(b"python mech.py") and err == b"", err


def test_interrupted_sweep_resumes_and_keeps_finished_runs(tmp_path):
    args = [sys.executable, SCRIPT, "--sweep", "ar-dconv", "--seeds", "1", "--jobs", "2", "--sweep-dir",
            str(tmp_path), "--figures-dir", str(tmp_path / "figures"), *TINY, "--no-interventions"]
    p = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    done = lambda: sorted(tmp_path.glob("*/metrics.json"))
    deadline = time.time() + 300
    while not done() and time.time() < deadline:
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGKILL)  # the sweep, and the runs it had started (each in a process group
    for pid in processes_in(tmp_path):  # of its own), as a job's processes are when the job is lost
        os.kill(pid, signal.SIGKILL)
    p.wait()
    first = {path: path.stat().st_mtime_ns for path in done()}
    assert 1 <= len(first) < 5
    r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert f"{len(first)} of 5 runs already done" in r.stdout
    assert len(done()) == 5
    assert all(path.stat().st_mtime_ns == t for path, t in first.items())  # nothing finished was redone


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    """Real results of very short runs: the Mamba d_conv sweep, 2 seeds (its figures: the default,
    in the sweep's directory)."""
    root = tmp_path_factory.mktemp("sweep")
    torch_threads = ["--jobs", "2"]
    experiments.main(["--sweep", "ar-dconv", "--seeds", "2", "--sweep-dir", str(root / "dconv"),
                      *torch_threads, *TINY])
    return root


def test_collect_and_figures(tiny_sweep, capsys):
    root = tiny_sweep
    records = experiments.main(["--collect", str(root), "--figures-dir", str(root / "figures")])
    assert len(records) == 10
    assert {(r["d_conv"], r["seed"]) for r in records} == {(k, s) for k in range(5) for s in (42, 43)}
    for r in records:
        with open(root / "dconv" / os.path.basename(r["folder"]) / "metrics.json") as f:
            assert json.load(f)["accuracy"] == r["accuracy"]
        assert set(r["attrib"]) >= {"key", "value", "query"}
        assert bool(r["conv"]) == (r["d_conv"] > 0)  # a conv to patch only where there is one
    with open(root / "results.json") as f:
        assert len(json.load(f)) == 10
    figures = sorted(os.listdir(root / "figures"))
    assert {"ar_accuracy.png", "ar_mamba_dconv.png"} <= set(figures)
    # Mamba's conv restoration is drawn from the runs whose corruption matters (the paper's 0.01 filter)
    assert ("mamba_conv_restored.png" in figures) == any(r["conv"] and r["effect"] >= 0.01 for r in records)
    for name in figures:
        with open(root / "figures" / name, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert "10 runs collected" in capsys.readouterr().out
    # the summary: one row per d_conv, its two seeds as mean ± std (min-max) of the recorded accuracies
    rows = table_rows((root / "summary.md").read_text())
    assert len(rows) == 5 and all(row[5] == "2" for row in rows)
    for row in rows:
        accs = sorted(r["accuracy"] for r in records if row[1] == ("mamba" if r["d_conv"] == 4 else f"mamba d_conv {r['d_conv']}"))
        assert row[6].startswith(f"{sum(accs) / 2:.3f} ± ") and row[6].endswith(f"({accs[0]:.3f}-{accs[1]:.3f})")


def test_sweeps_and_collections_draw_into_their_directory_unless_told_otherwise(tiny_sweep):
    # the committed figures/*.png are redrawn only on purpose, with --figures-dir figures
    def committed():
        folder = os.path.join(ROOT, "figures")
        return {name: os.stat(os.path.join(folder, name)).st_mtime_ns for name in os.listdir(folder)
                if name != "__pycache__"}
    before = committed()
    root = tiny_sweep / "dconv"
    assert {"ar_accuracy.png", "ar_mamba_dconv.png"} <= set(os.listdir(root / "figures"))  # the sweep's
    shutil.rmtree(root / "figures")
    assert len(experiments.main(["--collect", str(root)])) == 10
    assert {"ar_accuracy.png", "ar_mamba_dconv.png"} <= set(os.listdir(root / "figures"))
    assert committed() == before


def test_depth_figures_and_the_per_layer_attribution(tmp_path):
    for n in (1, 3):
        mech.main(["--arch", "mamba", "--layers", str(n), "--out", str(tmp_path / f"l{n}"), *TINY])
    records = experiments.main(["--collect", str(tmp_path), "--figures-dir", str(tmp_path / "figures")])
    assert sorted(len(r["query_by_layer"]) for r in records) == [1, 3]
    for r in records:  # App. D.3's number: Attrib@Query of each layer's mixer output, Key corrupted
        with open(tmp_path / r["folder"] / "metrics.json") as f:
            rows = json.load(f)["interventions"]["rows"]
        assert r["query_by_layer"] == [next(x["attrib"] for x in rows if (x["corrupted"], x["site"], x["layer"], x["position"])
                                            == ("key", "mixer_output", l, "query")) for l in range(r["n_layer"])]
    figures = set(os.listdir(tmp_path / "figures"))
    assert "ar_layers.png" in figures
    assert ("ar_layers_attrib.png" in figures) == any(r["effect"] >= 0.01 for r in records)


def test_a_depth_figure_says_why_each_slot_is_empty():
    """The 1-layer Based is never run (its one layer would be BaseConv's); any other empty slot is
    a run not collected (a sweep still running), not put down to Based."""
    series = [drawing.Series(drawing.layers_label(n), "C0", "o", lambda r: r["accuracy"],
                             keep=lambda r, n=n: r["n_layer"] == n) for n in (1, 2)]
    column = lambda arch, *depths: drawing.Column(arch, [dict(n_layer=n) for n in depths])
    note = drawing.not_run_note([column("based", 2), column("mamba", 1, 2)], series, "s")
    assert len(note) == 1 and "(based, 1 layer)" in note[0] and "no 1-layer Based" in note[0]
    note = drawing.not_run_note([column("based", 2), column("mamba", 1)], series, "s")
    assert len(note) == 2 and "(mamba, 2 layers): not among the runs collected" in note[1]
    assert drawing.not_run_note([column("mamba", 1, 2)], series, "s") == []


def test_best_over_lr_picks_the_best_run_per_seed():
    recs = [dict(arch="a", d_model=64, seed=s, lr=lr, accuracy=acc, dev_accuracy=None)
            for s, lr, acc in ((1, 1e-3, 0.5), (1, 3e-3, 0.9), (2, 1e-3, 0.7), (2, 3e-3, 0.2))]
    best = collect.best_over_lr(recs, "arch")
    assert [r["accuracy"] for r in best["a", 64]] == [0.9, 0.7]
    recs[1]["dev_accuracy"], recs[0]["dev_accuracy"] = 0.1, 0.8  # with a dev set, the dev accuracy chooses
    assert collect.best_over_lr(recs, "arch")["a", 64][0]["accuracy"] == 0.5


def test_the_caption_names_the_rates_tried_and_the_one_each_seed_kept():
    runs = [record(f"{a}{s}{lr}", acc, arch=a, task="atr", lr=lr, seed=s)
            for a, s, lr, acc in (("h3", 42, 1e-3, 0.5), ("h3", 42, 3e-3, 0.9), ("h3", 43, 3e-3, 0.8),
                                  ("mamba", 42, 1e-3, 0.9), ("mamba", 42, 3e-3, 0.1))]
    note = drawing.scale_note(runs)
    assert "best of the learning rates 0.001, 0.003 (kept: 0.003 (mamba 0.001))" in note
    assert "; seed 43 only at seed 42's kept rate;" in note
    one = drawing.scale_note([r for r in runs if r["lr"] == 3e-3])
    assert "one learning rate per model, 0.003" in one and "kept" not in one


# ── what a sweep counts as done, and how it stops ────────────────────────────────────────────

def test_sweep_flags_name_their_own_runs():
    plain = [name for name, _ in sweeps.sweep_runs("ar-dconv", "cpu", 1)]
    quick = [name for name, _ in sweeps.sweep_runs("ar-dconv", "cpu", 1, sweeps.sweep_overrides(["--steps", "1500"]))]
    longer = [name for name, _ in sweeps.sweep_runs("ar-dconv", "cpu", 1, sweeps.sweep_overrides(["--steps", "3000"]))]
    assert plain[0] == "ar_mamba_dconv0_s42" and re.fullmatch(r"ar_mamba_dconv0_s42_x[0-9a-f]{8}", quick[0])
    assert len(set(plain + quick + longer)) == 15  # a quick look never shares a folder with the full sweep
    # flags that do not change what is trained leave the names alone: --force can start a folder over
    assert sweeps.sweep_overrides(["--steps", "1500", "--force", "--device", "cpu", "--no-interventions"]) == {"steps": 1500}


def test_a_run_is_done_only_if_its_folder_holds_that_very_run(tmp_path):
    run = sweeps.sweep_runs("ar-dconv", "cpu", 1)[0][1]
    cfg = sweeps.run_config(run, TINY)
    folder = tmp_path / "run"
    folder.mkdir()
    write_config = lambda c: mech.save(str(folder / "config.json"), c)
    write_config(dataclasses.asdict(cfg))
    assert not sweeps.finished(str(folder), cfg)  # not finished: no metrics.json
    (folder / "metrics.json").write_text("{}")
    assert sweeps.finished(str(folder), cfg)
    assert not sweeps.finished(str(folder), sweeps.run_config(run, TINY + ["--steps", "7"]))
    old = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("preset", "atr", "bucket", "grammar_seed", "held_out")}
    write_config(old)  # an older mech.py's config.json: its missing fields take their defaults
    assert sweeps.finished(str(folder), cfg)
    write_config(dict(old, no_such_field=1))  # damaged, foreign, missing: not done (mech.py will say why)
    assert not sweeps.finished(str(folder), cfg)
    (folder / "config.json").write_text("{")
    assert not sweeps.finished(str(folder), cfg)
    (folder / "config.json").unlink()
    assert not sweeps.finished(str(folder), cfg)


def test_a_failed_sweep_says_so_in_one_line_and_force_starts_its_folders_over(tmp_path):
    flags = ATR_TINY + ["--steps", "20", "--eval-every", "10"]
    args = [sys.executable, SCRIPT, "--sweep", "atr-attention-nope", "--seeds", "1", "--jobs", "2", "--sweep-dir",
            str(tmp_path), "--figures-dir", str(tmp_path / "figures"), *flags]
    runs = sweeps.sweep_runs("atr-attention-nope", "cpu", 1, sweeps.sweep_overrides(flags))
    (easy, easy_run), (medium, _) = ((tmp_path / name, run) for name, run in runs)
    easy.mkdir()  # a finished run of another seed under this run's name; a damaged config.json
    mech.save(str(easy / "config.json"), dataclasses.asdict(sweeps.run_config(easy_run, flags + ["--seed", "7"])))
    (easy / "metrics.json").write_text("{}")
    medium.mkdir()
    (medium / "config.json").write_text('{"task": "at')
    r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 1 and "0 of 2 runs already done" in r.stdout, r.stdout + r.stderr
    failed = [line for line in r.stdout.splitlines() if line.startswith("FAILED (exit 1, see ")]
    assert sorted(line.split("see ")[1].split(")")[0] for line in failed) == [f"{easy}.log", f"{medium}.log"]
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "2 of 2 runs failed" in err[0] and "--force" in err[0], r.stderr
    assert "holds another run" in Path(f"{easy}.log").read_text() and "cannot be used" in Path(f"{medium}.log").read_text()
    # --force starts over the folder of another configuration, never one whose config.json is no run's
    r = subprocess.run(args + ["--force"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 1 and "1 of 2 runs failed" in r.stderr, r.stdout + r.stderr
    assert (medium / "config.json").read_text() == '{"task": "at'
    (medium / "config.json").unlink()  # moved away, as mech.py advises: the same command runs it
    r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "1 of 2 runs already done" in r.stdout, r.stdout + r.stderr
    assert all(sweeps.finished(str(tmp_path / name), sweeps.run_config(run, flags)) for name, run in runs)


def test_a_stopped_sweep_stops_its_runs_at_a_checkpoint_and_resumes(tmp_path):
    args = [sys.executable, SCRIPT, "--sweep", "atr-attention-nope", "--seeds", "1", "--jobs", "2", "--sweep-dir",
            str(tmp_path), "--figures-dir", str(tmp_path / "figures"), *ATR_TINY, "--steps", "600", "--eval-every", "20"]
    p = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 300  # both runs training, each past its first checkpoint
        while len(list(tmp_path.glob("*/checkpoint.pt"))) < 2 and time.time() < deadline:
            time.sleep(0.1)
        assert len(processes_in(tmp_path)) == 3  # the sweep and its two runs
        p.send_signal(signal.SIGTERM)  # to the sweep alone: its runs have process groups of their own
        out, err = p.communicate(timeout=120)
    finally:  # whatever happened, leave nothing running
        for pid in processes_in(tmp_path):
            os.kill(pid, signal.SIGKILL)
    assert p.returncode == 128 + signal.SIGTERM, out + err
    assert len(err.strip().splitlines()) == 1 and "the same command resumes the sweep" in err, err
    assert processes_in(tmp_path) == []  # no run outlives the sweep
    assert len(list(tmp_path.glob("*/checkpoint.pt"))) == 2 and not list(tmp_path.glob("*/metrics.json"))
    r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "0 of 2 runs already done" in r.stdout, r.stdout + r.stderr
    for path in tmp_path.glob("*/metrics.json"):
        assert json.loads(path.read_text())["steps"] == 600
    assert len(list(tmp_path.glob("*/metrics.json"))) == 2


def test_a_run_that_another_sweep_runs_is_not_started_again(tmp_path):
    """Two sweeps on one folder would chain their checkpoints: the second finds the run's .log
    locked (its process holds the lock while it lives) and reports it, starting nothing."""
    name, run = sweeps.sweep_runs("atr-attention-nope", "cpu", 1)[0]
    out = tmp_path / name
    lines = []
    with open(f"{out}.log", "a") as log:
        fcntl.flock(log, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running sweep's run holds it
        failed = sweeps.run_sweep([(name, run)], str(tmp_path), 1, ATR_TINY, log=lines.append)
    assert failed == [str(out)] and not out.exists()
    assert lines[-1] == f"FAILED (running in another process, its {out}.log locked)"


# ── collecting: seeds of one configuration, never more ───────────────────────────────────────

def test_runs_that_differ_in_more_than_their_seed_are_never_averaged():
    mamba = dict(task="ar", arch="mamba")
    full = [record(f"full{s}", acc, **mamba, seed=s) for s, acc in ((42, 0.9), (43, 0.8))]
    old = {k: v for k, v in full[0].items() if k not in ("preset", "atr", "bucket", "grammar_seed", "held_out")}
    full.append(dict(old, seed=44, folder="old44", accuracy=0.7))  # an older mech.py's: the same run
    quick = [record(f"quick{s}", acc, **mamba, steps=1500, seed=s) for s, acc in ((42, 0.1), (43, 0.2))]
    small = [record("small42", 0.5, **mamba, n_train=64, seed=42)]
    rows = table_rows(collect.summary_table(full + quick + small))
    # the rows the columns cannot tell apart name their other differences
    assert [(row[1], row[5], row[6].split()[0]) for row in rows] == [
        ("mamba (n_train 100032, steps 1500)", "2", "0.150"), ("mamba (n_train 100032, steps 20000)", "3", "0.800"),
        ("mamba (n_train 64, steps 20000)", "1", "0.500")]
    assert [row[1] for row in table_rows(collect.summary_table(full))] == ["mamba"]
    # the best learning rate is chosen within a configuration: the quick look's does not stand in for the full run's
    lrs = [dict(r, lr=1e-2, accuracy=r["accuracy"] - 0.05, folder=r["folder"] + "lr") for r in full]
    best = collect.best_over_lr(full + lrs + [dict(quick[0], accuracy=0.95)], "arch")
    assert sorted(r["folder"] for r in best["mamba", 64]) == ["full42", "full43", "old44", "quick42"]
    # the figures draw each model from one protocol, the one with the most runs, and name the others
    notes = []
    drawn = collect.one_protocol(full + quick + small, log=notes.append)
    assert [r["folder"] for r in drawn] == ["full42", "full43", "old44"]
    assert len(notes) == 1 and all(name in notes[0] for name in ("quick42", "quick43", "small42"))


# ── figures that stand alone: the paper's numbers, every run visible, summaries that are runs ─

def sweep_records(*names):
    """Records (accuracy 0.5) of the CPU-scale runs of the sweeps, one seed."""
    return [record(name, 0.5, **dataclasses.asdict(parse(run))) for sweep in names
            for name, run in sweeps.sweep_runs(sweep, "cpu", 1)]


def test_the_papers_numbers_cover_every_model_the_accuracy_figures_draw():
    paper = PAPER
    widths = len(sweeps.WIDTHS)
    ar = collect.main_ar(sweep_records("ar-main"))
    assert {r["arch"] for r in ar} == set(sweeps.ARCHS) == set(paper["ar_accuracy"])
    _, settings, models = collect.main_atr(sweep_records("atr-main", "atr-attention-nope"))
    assert "attention NoPE" in models  # every (setting, model) drawn: a number, or None (none)
    assert {(s, m) for s in settings for m in models} <= set(paper["atr_accuracy"])
    assert set(settings) == set(mech.ATR_SETTINGS)  # each with its copy-next-token line
    for table in ("ar_accuracy", "ar_layers", "ar_mamba_dconv", "based_conv", "atr_accuracy"):
        for values in paper[table].values():
            assert values is None or (len(values) == widths and all(0 <= v <= 1 for v in values))
    # the number beside ours is the paper's at our width, none at a width it did not train
    assert drawing.paper_accuracy(paper["ar_accuracy"]["mamba"], ar) == (0.806,)
    assert drawing.paper_accuracy(paper["ar_accuracy"]["mamba"], [dict(d_model=8)]) == (None,)
    assert drawing.paper_accuracy(None, ar) == (None,)  # DeltaNet: v3 gives no number


@pytest.mark.parametrize("ys, mark", [
    ([0.706, 0.803, 0.706], 0.706), ([0.025, 0.984, 0.959], None),  # split: max - min > 0.5
    ([0.5], None), ([0.1, 0.2], None),  # fewer than 3 runs: no middle one
    ([0.1, 0.4, 0.2, 0.3], 0.2)])  # an even number: the lower middle run
def test_the_summary_mark_is_the_median_run_or_none(ys, mark):
    assert drawing.summary_mark(ys) == mark
    assert mark is None or mark in ys  # a bar always lies on a run


def test_runs_with_the_same_value_are_drawn_apart_and_beside_the_papers_mark():
    runs = [record(f"r{s}", 0.706, arch="mamba", seed=s) for s in (44, 42, 43)]
    fig, ax = drawing.plt.subplots()
    drawing.strip_panel(ax, [drawing.Column("mamba", runs, (0.806,))], [drawing.ACCURACY])
    seeds, paper = (c.get_offsets() for c in ax.collections
                    if type(c).__name__ == "PathCollection")  # the markers, not the median bar
    drawing.plt.close(fig)
    xs = list(seeds[:, 0])
    assert len(set(xs)) == 3 and xs == sorted(xs) and set(seeds[:, 1]) == {0.706}
    assert paper[0, 0] > max(xs) and paper[0, 1] == 0.806
    assert len(set(drawing.spread_x(0.0, 5, 0.3))) == 5


def test_collect_tells_old_value_plus_one_cells_from_new(tmp_path):
    mamba = dict(task="atr", arch="mamba")
    conv = {("conv_output", 0, "value+1"): 0.9, ("block_input", 1, "key"): 0.6}
    fake_run(tmp_path / "old", conv, **mamba, seed=42)  # an older analysis: no "n"
    fake_run(tmp_path / "new", conv, n_docs=320, **mamba, seed=43)
    new, old = collect.collect(str(tmp_path))  # in the order of their folders' names
    assert old["conv"]["value+1"] == new["conv"]["value+1"] == 0.9
    assert old["conv_docs"]["value+1"] is None and new["conv_docs"]["value+1"] == 280
    assert collect.all_documents(old, "value+1") and not collect.all_documents(new, "value+1")
    assert new["n_docs"] == 320 and old["n_docs"] is None
    assert old["attrib"]["key"] == 0.6  # the rows' main setting, not the stored "main"
    notes = collect.summary_table([old, new]).split("\n\n")[1]
    assert "1 of 2 runs were analysed over all documents" in notes
    assert drawing.mamba_conv_restored([old, new], str(tmp_path)) == [
        str(tmp_path / "mamba_conv_restored.png")]


# a 1-layer model's only block input is the embedding, where patching the Key undoes the corruption
# itself: mech.verdict_attribs reads its mixer output instead
def test_a_one_layer_model_is_read_at_its_mixer_output_not_the_embedding(tmp_path):
    fake_run(tmp_path / "one", {("block_input", 0, "key"): 1.0, ("mixer_output", 0, "query"): 1.0},
             arch="mamba", n_layer=1)
    rec, = collect.collect(str(tmp_path))
    assert (rec["attrib"]["key"], rec["attrib"]["query"]) == (0.0, 1.0)
    assert table_rows(collect.summary_table([rec]))[0][7] == "0.00 / 0.00 / 1.00 (1)"


def test_the_figures_draw_one_width():
    recs = [record(f"d{d}s{s}", 0.5, d_model=d, seed=s) for d in (32, 64) for s in (42, 43)]
    notes = []
    assert {r["d_model"] for r in collect.one_width(recs, notes.append)} == {64}
    assert len(notes) == 1 and "d = 32" in notes[0]


# ── the mechanism while it forms ──────────────────────────────────────────────────────────────

def watched_run(folder, seed, value_by_step, accuracy_by_step, effect=0.5, arch="attention"):
    """A run folder whose curve was watched while training (mech.watch_mechanism's points)."""
    fake_run(folder, {("block_input", 1, "value"): 1.0}, arch=arch, seed=seed)
    path = os.path.join(folder, "metrics.json")
    with open(path) as f:
        m = json.load(f)
    m["curve"] = [dict(step=s, accuracy=accuracy_by_step[s], train_loss=0.5, test_loss=1.0,
                       attrib=dict(effect=effect if s > 100 else 0.0,
                                   main=dict(key=0.0, value=v, query=0.0),
                                   cells={"mixer_output[1]@query": v}))
                  for s, v in value_by_step.items()]
    mech.save(path, m)


def test_the_dynamics_table_says_what_comes_first(tmp_path):
    acc = {100: 0.0, 200: 0.1, 300: 0.6, 400: 1.0}
    watched_run(tmp_path / "a", 42, {100: 0.9, 200: 0.7, 300: 1.0, 400: 1.0}, acc)  # mechanism first
    watched_run(tmp_path / "b", 43, {100: 0.0, 200: 0.1, 300: 0.3, 400: 1.0}, acc)  # accuracy first
    records = collect.collect(str(tmp_path))
    assert all([p["step"] for p in r["dynamics"]] == [100, 200, 300, 400] for r in records)
    rows = [line.split(" | ") for line in collect.dynamics_table(records).splitlines()[2:]]
    # the 0.9 at step 100 does not count: the Key did not matter yet (effect below the filter)
    assert [(r[1], r[3], r[4], r[5], r[6]) for r in rows] == [
        ("42", "value", "200", "300", "mechanism, by 100 steps |"),
        ("43", "value", "400", "300", "accuracy, by 100 steps |")]
    # a run that never learns has no moment its accuracy rises (not its first evaluation's step)
    watched_run(tmp_path / "c", 44, {100: 0.0, 200: 0.7, 300: 0.7, 400: 0.7}, dict.fromkeys(acc, 0))
    rows = [line.split(" | ") for line in
            collect.dynamics_table(collect.collect(str(tmp_path))).splitlines()[2:]]
    assert [(r[1], r[4], r[5], r[6]) for r in rows if r[1] == "44"] == [("44", "200", "never", "- |")]
    os.makedirs(tmp_path / "figs")
    assert drawing.mechanism_dynamics(records, str(tmp_path / "figs")) == [
        str(tmp_path / "figs" / "mechanism_dynamics.png")]


def test_the_sweeps_of_the_papers_other_findings():
    """App. D.1 (pos_embed), D.2 (atr_layers), §5.3 (atr_gen) and D.4 (multihop)."""
    cfgs = lambda sweep, scale="cpu", seeds=1: [parse(r) for _, r in sweeps.sweep_runs(sweep, scale, seeds)]
    pe = cfgs("pos-embed")
    assert len(pe) == 3 * 7 and all(c.pos_emb == (c.arch != "attention") for c in pe)
    assert {(c.task, c.atr if c.task == "atr" else None) for c in pe} == {("ar", None), ("atr", "easy"), ("atr", "medium")}
    one = cfgs("atr-layers")
    assert {c.arch for c in one} == set(sweeps.ARCHS) - {"based"} and {c.n_layer for c in one} == {1}
    gen = cfgs("atr-gen", seeds=3)
    assert all(c.held_out == 0.2 and c.schedule == "wsd" for c in gen)  # the CPU preset, three rates
    assert {c.lr for c in gen} == {3e-4, 1e-3, 3e-3} and {c.n_layer for c in gen} == {1, 2, 3}
    assert len(gen) == (3 * 7 - 1) * 3 * 3
    assert {c.schedule for c in cfgs("atr-gen", "paper")} == {"linear"}  # the paper's, held out
    sib = cfgs("atr-sibling")
    assert all(c.atr_query == "sibling" and c.atr == "easy" for c in sib) and len(sib) == 3 * 7 - 1
    names = [name for name, _ in sweeps.sweep_runs("atr-gen", "cpu", 1)]
    assert "atr_easy_heldout0.2_mamba_layers2_lr0.001_s42" in names and len(set(names)) == len(names)


# ── the paper's other findings: figures of sweeps not run yet, drawn from fake run folders ────

def finding_run(root, name, accuracy=0.8, dev=None, **fields):
    """A fake run folder (fake_run) whose answer reacts to the Key and reads it at the Value (a
    1-layer model at its mixer output), with its own test and dev accuracy."""
    attribs = {("block_input", l, "value"): 1.0 for l in range(1, 3)}
    fake_run(root / name, attribs | {("mixer_output", 0, "value"): 1.0}, **fields)
    path = root / name / "metrics.json"
    m = json.loads(path.read_text())
    if dev:  # a held-out run: its dev documents' analysis reads the answer at the Query instead
        fake_run(root / "dev", {("block_input", l, "query"): 1.0 for l in range(3)}
                 | {("mixer_output", 0, "query"): 1.0}, **fields)
        m |= dict(dev_accuracy=dev, interventions_dev=json.loads(
            (root / "dev" / "metrics.json").read_text())["interventions"])
        shutil.rmtree(root / "dev")
    mech.save(str(path), dict(m, accuracy=accuracy))


def main_runs(root):
    """The runs of the main results (AR and ATR easy, 2 layers) and ATR Attention NoPE."""
    for seed in (42, 43):
        for arch in ("attention", "mamba"):
            finding_run(root, f"ar_{arch}_{seed}", arch=arch, seed=seed)
            finding_run(root, f"atr_{arch}_{seed}", task="atr", arch=arch, seed=seed)
        finding_run(root, f"atr_nope_{seed}", task="atr", arch="attention", pos_emb=False,
                    seed=seed)


def finding_runs(root):
    """main_runs, and runs of the sweeps pos-embed, atr-layers, atr-gen and atr-sibling."""
    main_runs(root)
    atr = dict(task="atr", atr="easy")
    for seed in (42, 43):
        for arch in ("attention", "mamba"):
            pe = dict(arch=arch, pos_emb=arch != "attention", seed=seed)
            finding_run(root, f"pe_ar_{arch}_{seed}", 0.3, **pe)
            finding_run(root, f"pe_atr_{arch}_{seed}", 0.7, **atr, **pe)
            finding_run(root, f"one_{arch}_{seed}", 0.6, **atr, arch=arch, n_layer=1, seed=seed)
            for n in (1, 2, 3):
                finding_run(root, f"sib_{arch}_{n}_{seed}", 0.9, **atr, atr_query="sibling",
                            arch=arch, n_layer=n, seed=seed)
                for lr, dev, test in ((1e-3, 0.95, 0.3), (3e-3, 0.9, 0.5)):  # dev picks 1e-3
                    finding_run(root, f"gen_{arch}_{n}_{lr:g}_{seed}", test, dev, **atr,
                                held_out=0.2, arch=arch, n_layer=n, lr=lr, seed=seed)


FINDINGS = {"pos_embed.png": drawing.pos_embed, "atr_layers.png": drawing.atr_layers,
            "atr_gen.png": drawing.atr_gen, "atr_sibling.png": drawing.atr_sibling}


def test_the_other_findings_are_drawn_from_their_runs_only(tmp_path):
    main_runs(tmp_path / "main")
    main = collect.collect(str(tmp_path / "main"))
    assert all(figure(main, str(tmp_path)) == [] for figure in FINDINGS.values())
    assert set(FINDINGS.values()) <= set(drawing.FIGURES)
    finding_runs(tmp_path / "all")
    records = collect.collect(str(tmp_path / "all"))
    for name, figure in FINDINGS.items():
        assert figure(records, str(tmp_path)) == [str(tmp_path / name)]
    # §5.3: each seed at the learning rate of its best dev accuracy, not of its best test accuracy
    gen = [r for r in records if r["held_out"]]
    assert {r["lr"] for r in collect.best_runs(gen)} == {1e-3}
    # and the dev documents' Attribs beside the test documents' (atr_gen_box.pdf's two halves)
    assert all(r["attrib"]["value"] == 1 and r["dev"]["attrib"]["query"] == 1
               and r["dev"]["attrib"]["value"] == 0 for r in gen)
    # the caption counts the runs past the filter on each set of documents the panels read
    on_dev = [r | r["dev"] | dict(effect=0.0) for r in gen[:1]] + gen[1:]  # one fails on dev
    note = drawing.filter_note(gen, (("dev", lambda runs: on_dev), ("test", list)))
    assert f"dev: {len(gen) - 1} of {len(gen)} runs pass; test: {len(gen)} of {len(gen)}" in note


def test_deeper_held_out_runs_are_read_at_the_second_layers_input_too(tmp_path):
    """Past 2 layers an induction model has moved the answer to the Query by the last layer's
    input; atr_gen reads the second layer's input (block_input[1]) instead."""
    fake_run(tmp_path / "deep", {("block_input", 1, "value"): 1.0,
                                 ("block_input", 2, "query"): 1.0}, task="atr", n_layer=3)
    fake_run(tmp_path / "two", {("block_input", 1, "value"): 1.0}, task="atr", n_layer=2)
    deep, two = sorted(collect.collect(str(tmp_path)), key=lambda r: r["n_layer"])[::-1]
    assert deep["attrib"]["query"] == 1 and deep["attrib_second"]["value"] == 1
    assert deep["attrib_second"]["query"] == 0 and two["attrib_second"] is None


def test_panels_that_share_their_columns_give_each_architecture_the_same_column(tmp_path,
                                                                                 monkeypatch):
    """pos_embed's panels share x: a setting without some architecture's runs keeps its column
    (empty), or the columns of the panels below would be drawn under the wrong names."""
    main_runs(tmp_path)
    finding_run(tmp_path, "pe_ar_mamba", 0.3, arch="mamba", pos_emb=True)  # AR only
    finding_run(tmp_path, "pe_atr_based", 0.7, task="atr", arch="based", pos_emb=True)  # ATR only
    labels = []
    monkeypatch.setattr(drawing, "strip_panel",
                        lambda ax, columns, series: labels.append([c.label for c in columns]))
    drawing.pos_embed(collect.collect(str(tmp_path)), str(tmp_path))
    assert labels == [["attention", "based", "mamba"]] * 2  # the AR and the ATR easy panel


def test_the_main_figures_leave_the_other_findings_runs_out(tmp_path):
    finding_runs(tmp_path)
    records = collect.collect(str(tmp_path))
    rs, settings, models = collect.main_atr(records)
    assert settings == ["easy"] and models == ["attention", "attention NoPE", "mamba"]
    # no sibling, held-out, 1-layer or PE runs; pos-embed's Attention NoPE is atr-attention-nope's
    assert {r["folder"].split("_")[0] for r in rs if r["pos_emb"]} == {"atr"}
    assert {r["folder"].split("_")[0] for r in collect.main_ar(records)} == {"ar"}
    assert not any(collect.main_variant(r) for r in records
                   if r["folder"].startswith(("sib", "gen", "pe")))
    tasks = {row[0].strip("| ") for row in table_rows(collect.summary_table(records))}
    assert tasks == {"ar", "atr easy", "atr easy sibling", "atr easy held-out 0.2"}
    # a sibling run is a model of its own: its protocol is not weighed against the parent's
    quick = [dict(r, steps=1500, folder="q" + r["folder"]) for r in rs if r["arch"] == "mamba"]
    siblings = [dict(r, atr_query="sibling", steps=1500, folder="s" + r["folder"]) for r in quick]
    assert len(collect.one_protocol(rs + siblings, log=lambda _: None)) == len(rs + siblings)
    assert len(collect.one_protocol(rs + quick, log=lambda _: None)) == len(rs)


def test_the_papers_numbers_cover_every_model_the_other_findings_draw():
    paper, widths = PAPER, len(sweeps.WIDTHS)
    pe = sweep_records("pos-embed", "ar-main", "atr-main")
    tables = [(paper["pos_embed"], {(drawing.pe_setting(r), r["arch"], p) for r in pe
                                    if drawing.pe_setting(r) in drawing.PE_SETTINGS
                                    for p in ("PE", "NoPE")}),
              (paper["atr_layers"], {r["arch"] for r in sweep_records("atr-layers")}),
              (paper["atr_gen"], {r["arch"] for r in sweep_records("atr-gen")}),
              (paper["atr_sibling"], {(r["arch"], r["n_layer"])
                                      for r in sweep_records("atr-sibling")})]
    for table, drawn in tables:
        assert drawn <= set(table)  # a number, or None (the paper has none)
    values = [v for table, _ in tables[:2] + tables[3:] for v in table.values()]
    values += [v[k] for v in paper["atr_gen"].values() if v for k in ("dev", "test")]
    for v in filter(None, values):  # by width; None: a point missing from the paper's figure
        assert len(v) == widths and all(x is None or 0 <= x <= 1 for x in v)
    assert paper["pos_embed"]["ar", "mamba", "PE"][2] == 0.522
    # atr_gen_box.pdf's medians: dev and test for each model atr_gen.pdf has, keyed as SHOWN
    gen = {a for a, v in paper["atr_gen"].items() if v}
    assert set(paper["atr_gen_mechanism"]) == {(d, a) for d in ("dev", "test") for a in gen}
    assert all(set(v) == set(drawing.SHOWN) for v in paper["atr_gen_mechanism"].values())


def test_a_flag_the_sweep_sets_per_run_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        experiments.main(["--sweep", "atr-attention-nope", "--seeds", "2", "--seed", "7"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--seed" in err and "--seeds N" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("flags, words", [(["--threads", "0"], "--threads must be at least 1"),
                                          (["--device", "foo"], "unknown device 'foo'")])
def test_a_flag_mech_refuses_outside_its_config_is_refused_once_before_any_run(
        flags, words, tmp_path, monkeypatch, capsys):
    """mech.main checks --threads, mech.choose_device the device: the sweep checks them as it
    checks the config, in mech.py's words, rather than each of its runs failing on them."""
    def start_run(*args):
        raise AssertionError("a run was started")
    monkeypatch.setattr(sweeps, "start_run", start_run)
    with pytest.raises(SystemExit) as e:
        experiments.main(["--sweep", "ar-dconv", "--jobs", "2", "--sweep-dir", str(tmp_path / "sw"),
                          *flags])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and words in err, err
    assert not os.path.exists(tmp_path / "sw")


def test_the_mixer_sweep_takes_its_architecture_from_the_sweeps_arch(capsys):
    """The sweep "mixer" (for a mixer of your own, registered in mech.MIXERS) sets no architecture
    per run: --arch, given to the whole sweep, is not refused, and the run folders' names say so."""
    runs = sweeps.sweep_runs("mixer", "cpu", 3)
    assert len(runs) == 6 and not any("arch" in run for _, run in runs)
    assert {(run["task"], run.get("atr")) for _, run in runs} == {("ar", None), ("atr", "easy")}
    experiments.main(["--sweep", "mixer", "--arch", "mamba", "--print-commands"])
    commands = [shlex.split(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert len(commands) == 6
    for cmd in commands:
        assert cmd[cmd.index("--arch") + 1] == "mamba" and cmd.count("--arch") == 1
        assert re.search(r"_s4[234]_x[0-9a-f]{8}$", cmd[cmd.index("--out") + 1])


def test_a_sweep_honours_an_explicit_threads(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(sweeps.subprocess, "Popen", lambda cmd, **kw: started.append(cmd))
    run = dict(preset="cpu", task="ar", arch="mamba", seed=42)
    sweeps.start_run(run, str(tmp_path / "a"), ["--threads", "1"], threads=2)
    sweeps.start_run(run, str(tmp_path / "b"), [], threads=2)
    assert started[0].count("--threads") == 1
    assert started[0][started[0].index("--threads") + 1] == "1"
    assert started[1][-2:] == ["--threads", "2"]


def test_collect_skips_a_damaged_run_in_one_line_and_keeps_the_rest(tmp_path):
    fake_run(str(tmp_path / "good"), {("block_input", 1, "value"): 1.0}, task="ar", arch="based")
    for name, text in (("cut", '{"accuracy": 0.'), ("empty", "{}"), ("list", "[1, 2]")):
        shutil.copytree(tmp_path / "good", tmp_path / name)
        (tmp_path / name / "metrics.json").write_text(text)
    lines = []
    records = collect.collect(str(tmp_path), log=lines.append)
    assert [r["folder"] for r in records] == ["good"]
    assert len(lines) == 3 and all(line.startswith("skipped ") for line in lines)


def test_collect_skips_a_run_the_tables_cannot_read_in_one_line_and_keeps_the_rest(tmp_path):
    """Damage that record() reads past but a table does not (issue 59): one line per folder."""
    watched_run(tmp_path / "good", 42, {100: 0.0, 200: 1.0}, {100: 0.0, 200: 1.0})
    damages = {"text": ("metrics.json", lambda m: m.update(accuracy="0.9")),
               "null": ("metrics.json", lambda m: m.update(accuracy=None)),
               "cells": ("metrics.json", lambda m: m["curve"][0]["attrib"].pop("cells")),
               "task": ("config.json", lambda c: c.update(task="xyz")),
               "rows": ("metrics.json", lambda m: m["interventions"].update(rows=[]))}
    for name, (file, damage) in damages.items():
        shutil.copytree(tmp_path / "good", tmp_path / name)
        with open(tmp_path / name / file) as f:
            fields = json.load(f)
        damage(fields)
        mech.save(str(tmp_path / name / file), fields)
    lines = []
    records = collect.collect(str(tmp_path), log=lines.append)
    assert [r["folder"] for r in records] == ["good"]
    assert [line.split(":")[0] for line in lines] == [
        f"skipped {tmp_path / name}" for name in sorted(damages)]
    assert all(line.count("\n") == 0 for line in lines)
    assert collect.summary_table(records) and collect.dynamics_table(records)


def test_a_sweep_outlives_a_reader_that_stops_reading():
    """sweeps.say: a broken pipe on stdout (`| head`) sends the rest to /dev/null, no error."""
    script = ("import sys; sys.path.insert(0, '.'); from figures.sweeps import say\n"
              "for i in range(20000): say('line', i)\n"
              "open(sys.argv[1], 'w').write('went on')")
    marker = os.path.join(ROOT, ".pytest_say_marker")
    proc = subprocess.Popen([sys.executable, "-c", script, marker], cwd=ROOT,
                            stdout=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()  # the reader stops
    try:
        assert proc.wait(60) == 0
        with open(marker) as f:
            assert f.read() == "went on"
    finally:
        if os.path.exists(marker):
            os.remove(marker)


def test_numbers_refuses_a_folder_without_runs_in_one_line(tmp_path):
    for root, words in ((tmp_path / "missing", "no folder"), (tmp_path, "no finished runs")):
        (tmp_path / "cpu_preset").mkdir(exist_ok=True)
        (tmp_path / "paper_protocol").mkdir(exist_ok=True)
        done = subprocess.run([sys.executable, os.path.join(ROOT, "figures", "experiments.py"),
                               "--numbers", str(root)], capture_output=True, text=True)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and words in done.stderr
        assert not os.path.exists(root / "numbers.md")



def test_numbers_refuses_a_damaged_or_foreign_run_in_one_line_and_writes_nothing(tmp_path,
                                                                                 capsys):
    """--numbers recounts the report from all its runs, whole, or not at all (issue 59): without
    a damaged seed a claim's mean would be over the others, and a run of no CPU sweep of the
    report, or not the run its name says, would join a group or make one of none (nan)."""
    cpu = tmp_path / "cpu_preset"
    fake_run(str(cpu / "ar_mamba_s42"), {}, task="ar", arch="mamba", seed=42)
    (tmp_path / "paper_protocol").mkdir()
    assert collect.refused_runs(str(tmp_path), collect.collect(str(cpu))) == []

    def no_accuracy(folder):
        fake_run(folder, {}, task="ar", arch="mamba", seed=43)
        path = os.path.join(folder, "metrics.json")
        with open(path) as f:
            mech.save(path, {k: v for k, v in json.load(f).items() if k != "accuracy"})

    def no_metrics(folder):
        os.makedirs(folder)
        shutil.copy(cpu / "ar_mamba_s42" / "config.json", folder)
    cases = [(cpu / "ar_mamba_s43", no_accuracy, "damaged run"),
             (tmp_path / "paper_protocol" / "x", no_metrics, "damaged run"),
             (cpu / "ar_mamba_d32_s42",
              lambda f: fake_run(f, {}, task="ar", arch="mamba", d_model=32), "foreign run"),
             (cpu / "ar_mamba_s43",  # not the run its name says
              lambda f: fake_run(f, {}, task="ar", arch="mamba", seed=44), "foreign run")]
    for folder, make, words in cases:
        make(str(folder))
        with pytest.raises(SystemExit) as e:
            experiments.main(["--numbers", str(tmp_path)])
        err = capsys.readouterr().err
        assert e.value.code == 1 and err.count("\n") == 1 and f"{words} {folder}:" in err, err
        assert not (tmp_path / "numbers.md").exists()
        shutil.rmtree(folder)


def test_numbers_never_write_a_nan():
    """A position no seed passes the filter at is "-", with no verdict; a mean over no runs (a
    claim's runs missing) is refused, naming its line (issue 59)."""
    nan = float("nan")
    assert collect.attribs_text(dict(key=nan, value=0.5, query=nan)) == "- / 0.50 / -"
    assert collect.mechanism_item("x", [], dict(key=0, value=1, query=0)) == (
        "x", "- / - / -", "0.00 / 1.00 / 0.00", "-")
    with pytest.raises(ValueError, match=r"\| C1 AR mamba \| nan ± nan \|"):
        collect.numbers_md([("C1 AR mamba", "nan ± nan", "0.806", "not reproduced")], {})
