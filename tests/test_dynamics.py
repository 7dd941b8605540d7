"""The mechanism watched while a model trains: a light interchange analysis at every evaluation."""
import json
import os

import pytest
import torch

import mech
from figures import plots

TINY = dict(d_model=16, num_kv=64, n_train=256, steps=30, eval_every=10, n_eval=32)


def quiet(msg):
    pass


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same tiny attention run twice, with and without the per-evaluation analysis."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("dynamics")
    cfg = mech.Config(arch="attention", **TINY)
    with_out, without = str(root / "with"), str(root / "without")
    lines = []
    model, metrics = mech.train(cfg, with_out, device="cpu", log=lines.append)
    model_off, metrics_off = mech.train(cfg, without, device="cpu", log=quiet, dynamics=False)
    return cfg, (model, metrics, with_out, lines), (model_off, metrics_off)


def test_every_evaluation_stores_the_watched_attribs(runs):
    cfg, (model, metrics, _, lines), _ = runs
    assert [p["step"] for p in metrics["curve"]] == [10, 20, 30]
    for point in metrics["curve"]:
        att = point["attrib"]
        assert set(att["main"]) == {"key", "value", "query"}
        assert set(att["cells"]) == {"mixer_output[0]@query", "mixer_output[1]@query"}
        assert isinstance(att["effect"], float)
    progress = [line for line in lines if line.startswith("step")]
    assert len(progress) == 3 and all("Key effect" in line for line in progress), progress


def test_the_watched_attribs_equal_the_full_analysis_on_the_same_documents(runs):
    cfg, (model, metrics, out, _), _ = runs
    task = mech.make_task(cfg)
    test = task.sample(cfg.n_eval, mech.rng_for(cfg.seed, "test"), split="test")
    docs = test[:mech.DYNAMICS_DOCS]
    full = mech.interchange(model, task, docs, "key", cfg.seed, cfg.value_corruption)
    cell = {(r["site"], r["layer"], r["position"]): r["attrib"] for r in full}
    last = metrics["curve"][-1]["attrib"]  # the final evaluation saw the final weights
    site, layer = mech.verdict_site(cfg.n_layer)
    assert last["main"] == {p: cell[site, layer, p] for p in ("key", "value", "query")}
    for l in range(cfg.n_layer):
        assert last["cells"][f"mixer_output[{l}]@query"] == cell["mixer_output", l, "query"]
    assert last["effect"] == mech.key_effect(full)
    saved, _ = mech.train(cfg, out, log=quiet)  # the saved model (finished: loaded) gives them
    assert mech.watch_mechanism(saved, task, test, cfg) == last


def test_turning_it_off_changes_nothing_else(runs):
    _, (model, metrics, _, _), (model_off, metrics_off) = runs
    a, b = model.state_dict(), model_off.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    strip = lambda curve: [{k: v for k, v in p.items() if k not in ("attrib", "time_s")} for p in curve]
    assert strip(metrics["curve"]) == strip(metrics_off["curve"])
    assert all("attrib" not in p for p in metrics_off["curve"])


def test_mamba_watches_its_conv_at_the_value_and_after_it():
    cfg = mech.Config(arch="mamba", scan="ref", d_model=16, n_layer=1, num_kv=64)
    task = mech.make_task(cfg)
    model = mech.build_model(cfg, task.vocab_size)
    att = mech.watch_mechanism(model, task, task.sample(8, mech.rng_for(0, "x")), cfg)
    assert list(att["main"]) == ["key", "value", "query"]  # the verdict's cells first
    assert set(att["cells"]) == {"mixer_output[0]@query", "conv_output[0]@value",
                                 "conv_output[0]@value+1"}


def test_no_dynamics_from_the_command_line_stores_no_attribs(tmp_path):
    out = str(tmp_path / "off")
    mech.main(["--arch", "attention", "--d-model", "16", "--num-kv", "64", "--n-train", "256",
               "--steps", "20", "--eval-every", "10", "--n-eval", "32", "--threads", "1",
               "--no-interventions", "--no-dynamics", "--out", out])
    with open(os.path.join(out, "metrics.json")) as f:
        assert all("attrib" not in p for p in json.load(f)["curve"])


def test_marks_the_moments_the_mechanism_forms_and_the_accuracy_rises():
    curve = [dict(step=s, accuracy=a, test_loss=1.0,
                  attrib=dict(effect=e, main=dict(key=0.0, value=v, query=0.0), cells={}))
             for s, a, e, v in ((100, 0.0, 0.001, 0.9),   # no effect yet: the 0.9 is noise
                                (200, 0.1, 0.3, 0.2), (300, 0.3, 0.5, 0.7), (400, 0.6, 0.8, 1.0),
                                (500, 0.9, 0.9, 1.0))]
    assert plots.moments(curve, "value", 0.1) == dict(mechanism=300, accuracy=400)
    assert plots.moments(curve, "value", 0.001) == dict(mechanism=100, accuracy=400)
    assert plots.moments(curve, None, 0.1) == dict(mechanism=None, accuracy=400)
    flat = [dict(p, accuracy=0.0) for p in curve]  # never learned: accuracy never rises
    assert plots.moments(flat, "value", 0.1) == dict(mechanism=300, accuracy=None)


def test_a_partly_watched_run_gets_no_dynamics_figure_and_captions_never_say_none():
    rows = [dict(site="block_input", layer=0, position="value", corrupted="key", attrib=1.0)]
    point = lambda s, watched=True: dict(step=s, accuracy=0.0, test_loss=1.0, **(
        dict(attrib=dict(effect=0.5, main=dict(key=0.0, value=1.0, query=0.0), cells={}))
        if watched else {}))
    # resumed with --no-dynamics: watched for its first evaluations only
    partly = [point(100), point(200), point(300, False)]
    pngs = plots.run_figures(rows, partly, "value", "block_input", 0.1, ("value",), "t")
    assert [name for name, _ in pngs] == ["mechanism.png"]
    captions = []
    plots.plt.Figure.suptitle = lambda self, text, **kw: captions.append(text)
    try:
        pngs = plots.run_figures(rows, partly[:2], "value", "block_input", 0.1, ("value",), "t")
    finally:
        del plots.plt.Figure.suptitle
    assert [name for name, _ in pngs] == ["mechanism.png", "dynamics.png"]
    assert not any("None" in c for c in captions) and "never rises" in captions[-1]


def test_the_dynamics_benchmark_runs(capsys):
    """figures/bench_dynamics.py, a quick look: 2 training steps and one watch_mechanism call."""
    from figures import bench_dynamics
    bench_dynamics.main(["--arch", "attention", "--task", "ar", "--repeats", "1",
                         "--eval-every", "2"])
    row = capsys.readouterr().out.strip().splitlines()[-1]
    assert row.startswith("| ar | attention | ") and "(2)" in row and row.endswith(" % |")
    with pytest.raises(SystemExit) as e:  # a bad value: one line, as mech.py says it
        bench_dynamics.main(["--eval-every", "0"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "eval_every" in err


def test_plots_ends_in_one_line_for_a_run_with_damaged_metrics(tmp_path, capsys):
    """figures/plots.py RUN: whatever in metrics.json cannot be drawn, one line that names the run
    (exit code 1), not a traceback."""
    rows = [dict(site="block_input", layer=0, position=p, corrupted="key",
                 attrib=float(p == "value"), p_clean=0.9, p_corr=0.1) for p in ("value", "query")]
    main = dict(key=0.0, value=1.0, query=0.0)
    whole = dict(accuracy=0.5, curve=[], interventions=dict(rows=rows, main=main))
    no_attrib = [{k: v for k, v in r.items() if k != "attrib"} for r in rows]
    damages = [dict(interventions={}), dict(interventions=None), dict(accuracy=None),
               dict(interventions=dict(rows=[], main=main)),
               dict(interventions=dict(rows=no_attrib, main=main))]
    for i, damage in enumerate([{}] + damages):
        run = tmp_path / str(i)
        run.mkdir()
        mech.save(str(run / "config.json"), dict(task="ar", arch="attention", n_layer=2))
        mech.save(str(run / "metrics.json"), whole | damage)
        try:
            plots.main([str(run)])
            code = 0
        except SystemExit as e:
            code = e.code
        err = capsys.readouterr().err
        if not damage:  # the whole run is drawn
            assert code == 0 and (run / "mechanism.png").exists()
        else:
            assert code == 1 and err.count("\n") == 1 and f"{run} cannot be drawn" in err, err
