"""The report's numbers and verdicts are those of the committed runs: recounted from
figures/runs, they match the generated tables (figures/runs/numbers.md, runs/cpu_preset/summary.md),
and the prose of figures/README.md and README.md quotes them."""
import decimal
import json
import os
import re
import statistics

import pytest

from figures import collect

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RUNS = os.path.join(ROOT, "figures", "runs")
REPORT = open(os.path.join(ROOT, "figures", "README.md")).read()
README = open(os.path.join(ROOT, "README.md")).read()
LABELS = ("reproduced", "direction only", "partly", "not reproduced")


@pytest.fixture(scope="module")
def records():
    return collect.collect(os.path.join(RUNS, "cpu_preset"))


@pytest.fixture(scope="module")
def items(records):
    return collect.report_numbers(RUNS, records)


def test_the_generated_tables_are_those_of_the_runs(records, items):
    with open(os.path.join(RUNS, "numbers.md")) as f:
        assert f.read() == collect.numbers_md(items, collect.generated_tables(RUNS, records))
    table = "\n\n".join(filter(None, (collect.summary_table(records),
                                      collect.dynamics_table(records))))
    with open(os.path.join(RUNS, "cpu_preset", "summary.md")) as f:
        assert f.read() == table + "\n"


def test_the_report_quotes_every_accuracy_and_attrib_it_recounts(items):
    # every recounted accuracy (mean ± sd) and Attrib triple of the claims is in the report
    quoted = [ours for name, ours, _, _ in items if name.startswith(("C", "D.", "5.3"))
              and ("±" in ours or re.fullmatch(r"[-0-9. /]+", ours))]
    report = REPORT.replace("-0.00", "0.00")
    missing = [q for q in quoted if q.replace("-0.00", "0.00") not in report and q not in README]
    assert not missing, missing


def test_the_formation_table_is_recounted(items):
    steps = {}  # (model, which) -> [step per seed], in seed order
    for name, ours, _, _ in items:
        if name.startswith("formation "):
            model = name[len("formation "):].split(" seed ")[0]
            for which, step in zip(("mechanism", "accuracy"), ours.split(" / ")):
                steps.setdefault((model, which), []).append(
                    step if step == "never" else f"{int(step):,}")
    assert len(steps) == 8
    for (model, which), values in steps.items():
        assert ", ".join(values) in REPORT, (model, which, values)


def test_the_cost_table_is_recounted(items):
    cost = {name: ours.split(", ") for name, ours, _, _ in items if name.startswith("cost ")}
    row = next(line for line in REPORT.splitlines() if line.startswith("| the CPU preset"))
    for name in ("cost main: runs, run-minutes", "cost other findings: runs, run-minutes"):
        runs, minutes = cost[name]
        assert f"{runs} " in row and f"{minutes} run-minutes" in row, (name, row)
    for sweep in collect.OTHER_SWEEPS:
        runs, minutes = cost[f"cost {sweep}: runs, run-minutes"]
        assert f"`{sweep}` {runs}" in row and f"`{sweep}` {minutes}" in row, sweep


def test_each_claims_verdict_is_the_rules(items):
    """The claims table of figures/README.md gives each claim every label its recounted items
    get (in bold), and no other (but "partly" for a claim whose items differ)."""
    for claim in ("C1", "C2", "C3", "C4", "C5", "C6", "C7"):
        labels = {v for name, _, _, v in items if name.split()[0] == claim and v in LABELS}
        row = next(line for line in REPORT.splitlines() if line.startswith(f"| {claim}:"))
        verdict = row.rsplit(" | ", 1)[1]
        bold = set(re.findall(r"\*\*([a-z ]+?)\*\*", verdict)) & set(LABELS)
        allowed = labels | ({"partly"} if len(labels) > 1 else set())
        assert labels <= bold <= allowed, (claim, labels, bold)


def test_the_class_preset_table_quotes_its_runs(items):
    """README.md's "The paper in one class" and the report's class-preset table: each claim's runs
    (figures/runs/class_preset) beside the CPU preset's, recounted: accuracy, Attribs, Mamba's conv
    at Value+1, verdicts."""
    rows = [(name, ours, same) for name, ours, _, same in items if name.startswith("class ")]
    assert len(rows) == 2 * len(collect.CLASS_CLAIMS)  # both presets ran every claim
    for name, ours, same in rows:
        accuracy, attribs, conv, verdicts, minutes = ours.split("; ")
        start = "| | CPU |" if name.endswith("cpu preset") else "| "
        line = next((l for l in REPORT.splitlines() if l.startswith(start)
                     and accuracy in l and verdicts in l), None)
        assert line is not None, (name, ours)
        assert all(x == "-" or x in line for x in (attribs, conv)), (name, ours)
        if same != "-":  # the presets compared by the rule: the claim's row (above) says so
            claim_row = REPORT.splitlines()[REPORT.splitlines().index(line) - 1]
            assert claim_row.rsplit(" | ", 1)[1].startswith(
                "**same**" if same == "same" else f"**{same}**"), (name, same)


def one_line(text: str) -> str:
    return " ".join(text.split())


def minutes(seconds: float, places: str = "0.1") -> str:
    """Minutes as the report rounds them: half up."""
    return str(decimal.Decimal(seconds / 60).quantize(decimal.Decimal(places),
                                                      decimal.ROUND_HALF_UP))


def test_the_report_copies_every_generated_table(records):
    for title, table in collect.generated_tables(RUNS, records).items():
        assert table in REPORT, title


def test_the_rule_is_stated_once_and_can_fail():
    assert one_line(REPORT).count(collect.RULE) == 1
    # Hyena at d = 128, where the paper's 0.138 lies below AR's line: a run that learned nothing
    # fails, as does one under half the paper's; one past half is direction only
    assert collect.label(collect.accuracy_direction(0.006, 0.138, 0.5), False) == "not reproduced"
    assert not collect.accuracy_direction(0.043, 0.138, 0.5)
    assert collect.accuracy_direction(0.081, 0.138, 0.5)
    assert collect.accuracy_direction(0.007, 0.019, 0.5)  # within 0.05 of a failing paper's
    assert not collect.accuracy_direction(0.9, 0.138, 0.5)  # learns where the paper's fails
    assert not collect.gap_direction(-0.033, 0.009) and collect.gap_direction(-0.003, 0.0)
    assert collect.group_label(["reproduced", "direction only"]) == "partly"


def test_every_verdict_group_the_prose_names_is_the_rules(items):
    """The groups the prose labels: App. D.1's gaps per setting, §5.3's mechanism."""
    verdict = {name: v for name, _, _, v in items}
    d1 = lambda where: collect.group_label(v for n, v in verdict.items()
                                           if n.startswith(f"D.1 {where} ") and v != "-")
    assert d1("AR") == "partly" and "**AR: partly." in REPORT
    others = collect.group_label(v for n, v in verdict.items() if n.startswith("D.1 ATR ")
                                 and " attention " not in n and v != "-")
    assert others == "partly" and "**ATR, the others: partly." in REPORT
    attention = collect.group_label(v for n, v in verdict.items()
                                    if n.startswith("D.1 ATR") and " attention " in n)
    assert f"**ATR, Attention: {attention}**" in REPORT
    gen = collect.group_label(v for n, v in verdict.items() if n.startswith("5.3")
                              and n.endswith("Attribs"))
    assert f"**Mechanism (`atr_gen_box.pdf`): {gen}**" in REPORT


def protocol_runs():
    return {r["folder"]: r for r in collect.collect(os.path.join(RUNS, "paper_protocol"))}


def test_the_cost_table_gives_the_protocol_times():
    runs = protocol_runs()
    row = next(line for line in REPORT.splitlines() if line.startswith("| the paper's protocol"))
    groups = {"Mamba on AR ": ["ar_mamba_"], "Based with PE on AR ": ["ar_based_pe_"],
              "Attention on ATR easy ": ["atr_easy_attention_"],
              "Mamba without its conv on ATR easy ": ["atr_easy_mamba_dconv0_lr0.001",
                                                     "atr_easy_mamba_dconv0_lr0.003_s42",
                                                     "atr_easy_mamba_dconv0_lr0.01"],
              "(": ["atr_easy_mamba_dconv0_lr0.003_s43", "atr_easy_mamba_dconv0_lr0.003_s44"],
              "BaseConv on ATR Σ8192 ": ["atr_8192_base_conv_lr0.001",
                                         "atr_8192_base_conv_lr0.003"],
              "min (": ["atr_8192_base_conv_lr0.0001", "atr_8192_base_conv_lr0.0003",
                        "atr_8192_base_conv_lr3e-05"],
              "Hyena with it: ": ["atr_medium_hyena_lr0.003_s43", "atr_medium_hyena_lr0.003_s44"],
              "on the 2 cores, ": ["atr_medium_hyena_lr0.001", "atr_medium_hyena_lr0.003_s42"]}
    for words, prefixes in groups.items():
        walls = [r["wall_time_s"] for f, r in runs.items() if f.startswith(tuple(prefixes))]
        assert f"{words}{minutes(min(walls))}–{minutes(max(walls))} min" in row, words


def test_the_class_times_are_recounted():
    times = {}
    with open(os.path.join(RUNS, "class_preset", "command_times.tsv")) as f:
        for line in f:
            if not line.startswith("#"):
                name, seconds = line.split()[:2]
                times.setdefault(name.rsplit("_s", 1)[0], []).append(int(seconds))
    medians = [sorted(s)[1] for s in times.values()]
    every = [s for ss in times.values() for s in ss]
    assert f"{minutes(min(medians))}–{minutes(max(medians))} min a run" in one_line(README)
    assert f"Each run takes {minutes(min(every))}–{minutes(max(every))} min" in one_line(REPORT)
    for run, seconds in times.items():  # the report's class table: whole-command seconds
        assert " / ".join(map(str, seconds)) + " s" in REPORT, run
    rows = {"attention": "ar_attention", "based": "ar_based", "mamba --dconv 4": "ar_mamba_dconv4",
            "mamba --dconv 1": "ar_mamba_dconv1", "mamba --dconv 0 --task atr":
            "atr_easy_mamba_dconv0"}
    for flags, run in rows.items():  # README's table: seed 42's whole command
        line = next(l for l in README.splitlines() if f"--preset class --arch {flags}`" in l)
        assert f"| {minutes(times[run][0])} min |" in line, flags
    assert f"`--dconv 0` too, {minutes(times['ar_mamba_dconv0'][0])} min" in README


def test_the_prose_numbers_of_the_paper_protocol():
    runs = protocol_runs()
    mean = lambda fs: sum(runs[f]["accuracy"] for f in fs) / len(fs)
    at_3e3 = [f"atr_easy_mamba_dconv0_lr0.003_s{s}" for s in (42, 43, 44)]
    gap = mean(at_3e3) - runs["atr_easy_mamba_dconv0_lr0.01_s42"]["accuracy"]
    for text in (f"{gap:.3f} less accurate than 3e-3's mean", f"{gap:.3f} below 3e-3's mean"):
        assert text in one_line(REPORT), text
    losses = []
    for s in (42, 43, 44):
        with open(os.path.join(RUNS, "paper_protocol", f"atr_8192_base_conv_lr0.0001_s{s}",
                               "metrics.json")) as f:
            losses.append(json.load(f)["test_loss"])
    assert f"test loss {min(losses):.1f}–{max(losses):.1f} at the end" in one_line(REPORT)
    h3 = collect.PAPER["ar_accuracy"]["h3"]
    assert f"H3 learns AR at no width in the paper ({min(h3):.3f}–{max(h3):.3f})" in REPORT


# ── the prose of the sections issue 50 touched, recounted from the runs ──────────────────────────

def section(heading: str) -> str:
    """The report's section under the heading that starts with `heading`, on one line."""
    start = REPORT.index("\n" + heading)
    end = REPORT.find("\n## ", start + 1)
    return one_line(REPORT[start:end if end > 0 else None])


def metrics(preset: str, folder: str) -> dict:
    with open(os.path.join(RUNS, preset, folder, "metrics.json")) as f:
        return json.load(f)


def loss(x: float) -> str:
    """A final training loss as the report writes it: 2 decimals, or one digit's power of ten."""
    return f"{x:.2f}" if x >= 0.01 else f"{x:.0e}".replace("e-0", "e-")


def test_the_c3_hyena_prose_is_recounted(records):
    text = section("## C3 for Hyena")
    groups = collect.hyena_groups(RUNS, records)
    cpu = {d: sorted(rs, key=lambda r: r["seed"]) for d, p, rs in groups if p.startswith("CPU")}
    pp = {(d, r["lr"], r["seed"]): r for d, p, rs in groups if not p.startswith("CPU") for r in rs}
    paper = dict(zip(collect.WIDTHS, collect.PAPER["ar_accuracy"]["hyena"]))
    mean = {d: sum(r["accuracy"] for r in rs) / len(rs) for d, rs in cpu.items()}
    runs = [r for _, _, rs in groups for r in rs]
    past = [r for r in runs if collect.reacts(r)]
    weak = [r["effect"] for r in past if r["effect"] < 0.1]
    wanted = [
        # the figure's paragraph
        f"the paper's × at each width ({paper[64]:.3f}, {paper[128]:.3f}, {paper[256]:.3f})",
        f"every run past the 0.01 filter ({len(past)} of {len(runs)})",
        f"the CPU preset's means {mean[64]:.3f}, {mean[128]:.3f}, {mean[256]:.3f}",
        f"at 3e-3 {pp[128, 3e-3, 42]['accuracy']:.3f} at d = 128, "
        f"{pp[256, 3e-3, 42]['accuracy']:.3f} and {pp[256, 3e-3, 43]['accuracy']:.3f} at d = 256",
        f"(@Query {min(r['attrib']['query'] for r in past):.2f}–"
        f"{max(r['attrib']['query'] for r in past):.2f}, @Key and @Value within 0.001 of 0)",
        # the bullets
        f"that run's is {pp[128, 1e-2, 42]['effect']:.3f}",
        f"by {min(weak):.3f}–{max(weak):.3f} only",
        f"({mean[64]:.3f} at d = 64, {mean[128]:.3f} at 128, {mean[256]:.3f} at 256)"]
    assert max(abs(r["attrib"][p]) for r in past for p in ("key", "value")) < 0.001
    assert len({round(mean[d] / paper[d], 1) for d in (128, 256)} | {0.3}) == 1  # "about 0.3"
    top = round(max([r["accuracy"] for r in runs] + [paper[d] for d in cpu]) + 0.06, 1)
    assert f"axis ends at {top}" in text  # as drawing.hyena_widths draws it
    m = {d: [metrics("cpu_preset", r["folder"]) for r in rs] for d, rs in cpu.items()}
    train = {d: ", ".join(loss(x["curve"][-1]["train_loss"]) for x in m[d]) for d in (128, 256)}
    tests = [x["test_loss"] for d in (128, 256) for x in m[d]]
    wanted.append(f"final training loss {train[128]} (d = 128) and {train[256]} (d = 256) against "
                  f"test losses {min(tests):.2f}–{max(tests):.2f}")
    wall = {d: [minutes(x["wall_time_s"], "1") for x in m[d]] for d in (128, 256)}
    assert wall[256][1] == wall[256][2]
    wanted.append(f"{min(wall[128], key=int)}–{max(wall[128], key=int)} min a run at d = 128, and "
                  f"{wall[256][0]} min (seed 42) and {wall[256][1]} min (seeds 43, 44) at d = 256")
    # the paper's protocol at d = 128 (seed 42 at three rates) and d = 256 (3e-3, seeds 42 and 43)
    p128 = [metrics("paper_protocol", pp[128, lr, 42]["folder"]) for lr in (1e-3, 3e-3, 1e-2)]
    assert len({minutes(x["wall_time_s"], "1") for x in p128[:2]}) == 1
    wanted += [f"{minutes(p128[0]['wall_time_s'], '1')} min a run at lr 1e-3 and 3e-3",
               ", ".join(f"{x['accuracy']:.3f}" for x in p128[:2])
               + f" and {p128[2]['accuracy']:.3f} (at most "
               + ", ".join(f"{max(p['accuracy'] for p in x['curve']):.3f}" for x in p128[:2])
               + f" and {max(p['accuracy'] for p in p128[2]['curve']):.3f} along the curve)",
               "final training loss " + ", ".join(loss(x["curve"][-1]["train_loss"])
                                                  for x in p128[:2])
               + f" and {loss(p128[2]['curve'][-1]['train_loss'])}, test loss "
               + ", ".join(f"{x['test_loss']:.1f}" for x in p128[:2])
               + f" and {p128[2]['test_loss']:.1f}"]
    p256 = [metrics("paper_protocol", pp[256, 3e-3, s]["folder"]) for s in (42, 43)]
    both = [pp[256, 3e-3, s] for s in (42, 43)]
    at15k = [next(p["accuracy"] for p in x["curve"] if p["step"] == 15000) for x in p256]
    mean256 = sum(x["accuracy"] for x in p256) / 2
    assert {loss(x["curve"][-1]["train_loss"]) for x in p256} == {"2e-5"}
    assert all(abs(r["attrib"][p]) < 0.0005 for r in both
               for p in ("key", "value", "value+1", "value+2", "divider"))  # "every other 0.000"
    wanted += [f"reach {p256[0]['accuracy']:.3f} and {p256[1]['accuracy']:.3f} (at most "
               + " and ".join(f"{max(p['accuracy'] for p in x['curve']):.3f}" for x in p256)
               + f" along the curve; {at15k[0]:.3f} and {at15k[1]:.3f} at step 15k)",
               f"stay {paper[256] - mean256:.3f} below",
               f"Key effect {both[0]['effect']:.3f} and {both[1]['effect']:.3f}",
               "(final training loss 2e-5, test loss " + " and ".join(f"{x['test_loss']:.2f}"
                                                                       for x in p256) + ")",
               f"Seed 42 took {minutes(p256[0]['wall_time_s'], '1')} min",
               f"two threads at {p256[0]['steps_per_s']:.1f} steps/s",
               f"seed 43 {minutes(p256[1]['wall_time_s'], '1')} min on two threads"]
    assert [x["threads"] for x in p256] == [2, 2]
    missing = [w for w in wanted if w not in text]
    assert not missing, missing


def test_the_coinciding_formation_markers_are_named(records):
    """mechanism_dynamics.png stacks the formation markers that share a step; the report's
    paragraph below the formation table names each such step and its seeds, panel by panel."""
    from figures import drawing
    drawn = collect.one_width(collect.one_protocol(records, lambda m: None), lambda m: None)
    found = [(step, sorted({r["seed"] for r, _, _ in marks}))
             for _, rs in collect.watched_runs(drawn)
             for step, marks in drawing.formation_marks(rs).items() if len(marks) > 1]
    text = section("## The mechanism while it forms")
    clauses = text.split("its caption names them: ")[1].split(". ")[0].split("; ")
    assert len(clauses) == len(found), clauses
    for clause, (step, seeds) in zip(clauses, found):
        assert f"seeds {' and '.join(map(str, seeds))}" in clause and f"{step:,}" in clause, clause


def test_the_conv_width_paragraph_is_recounted(records):
    """mamba_conv_restored.png's AR d_conv 2 and 3 columns, cited in "Positions that coincide"."""
    text = section("## Positions that coincide")
    conv = {(r["d_conv"], r["seed"]): r for r in records if r["arch"] == "mamba"
            and r["task"] == "ar" and r["n_layer"] == 2 and r["d_model"] == 64
            and collect.main_variant(r) and r.get("conv")}
    c = lambda k, s, p: conv[k, s]["conv"][p]
    assert all(collect.all_documents(conv[3, s], "value+1") for s in (42, 43, 44))
    past2 = [s for s in (42, 43, 44) if collect.reacts(conv[2, s])]
    assert past2 == [43]
    wanted = [", ".join(f"{c(4, s, 'value+1'):.3f}" for s in (42, 43, 44)).replace(", ", " / "),
              f"(@Value {c(3, 42, 'value'):.3f} and {c(3, 43, 'value'):.3f}, @Value+1 "
              f"{c(3, 42, 'value+1'):.2f} and {c(3, 43, 'value+1'):.2f}; accuracy "
              f"{conv[3, 42]['accuracy']:.3f} and {conv[3, 43]['accuracy']:.3f})",
              f"at Value+1 in seed 44 ({c(3, 44, 'value+1'):.2f};",
              f"(43, accuracy {conv[2, 43]['accuracy']:.3f}) has it at the Value "
              f"({c(2, 43, 'value'):.2f})"]
    plain = lambda t: t.replace("-0.00", "0.00").replace("−", "-")
    missing = [w for w in wanted if plain(w) not in plain(text)]
    assert not missing, missing


def curve_range(preset: str, folder: str, position: str, from_step: int) -> str:
    """"0.95–1.15": the range of a run's watched Attrib at a position from a step on."""
    ys = [p["attrib"]["main"][position] for p in metrics(preset, folder)["curve"]
          if "attrib" in p and p["step"] >= from_step]
    return f"{min(ys):.2f}–{max(ys):.2f}"


def test_the_prose_of_the_paper_protocol_is_recounted():
    text = section("## The paper's own protocol")
    runs = protocol_runs()
    acc = lambda prefix: [r["accuracy"] for f, r in sorted(runs.items()) if f.startswith(prefix)]
    d0 = "atr_easy_mamba_dconv0_lr"
    at3 = [runs[f"{d0}0.003_s{s}"] for s in (42, 43, 44)]
    hy = [runs[f"atr_medium_hyena_lr0.003_s{s}"] for s in (42, 43, 44)]
    bc = [runs[f"atr_8192_base_conv_lr0.0001_s{s}"] for s in (42, 43, 44)]
    mean = lambda rs, p: sum(r["attrib"][p] for r in rs) / len(rs)
    diag = {f: metrics("diagnostics", f"{d0}{f}") for f in
            [f"{lr}_s{s}" for lr in ("0.003", "0.01") for s in (42, 43, 44)]}
    train = [diag[f"0.01_s{s}"]["curve"][-1]["train_loss"] for s in (42, 43, 44)]
    wanted = [
        f"at the best rate the three seeds give {collect.mean_sd(acc('ar_mamba_lr0.01_'))}",
        f"({collect.mean_sd(acc('atr_easy_attention_lr0.001_'))}, the paper's 0.938)",
        f"(the 3 seeds: {collect.mean_sd([r['accuracy'] for r in at3])})",
        f"mean {mean(at3, 'value'):.2f}",
        f"**{collect.mean_sd([r['accuracy'] for r in hy])}** over the three seeds",
        f"**{collect.mean_sd([r['accuracy'] for r in bc])}** over the three seeds",
        f"over the three seeds the Value ({mean(bc, 'value'):.2f}) holds more than the Key "
        f"({mean(bc, 'key'):.2f})",
        "test loss " + " and ".join(
            f"{metrics('paper_protocol', f'atr_8192_base_conv_lr{lr}_s42')['test_loss']:.1f}"
            for lr in ("0.001", "0.003")) + " at the end",
        f"{curve_range('paper_protocol', f'{d0}0.01_s42', 'value', 10000)} at every evaluation "
        "from step 10k on",
        f"{curve_range('paper_protocol', f'{d0}0.003_s42', 'value', 30000)} from 30k on",
        f"{curve_range('paper_protocol', f'{d0}0.001_s42', 'value', 30000)} from 30k to the end",
        f"seed 43's curve {curve_range('paper_protocol', f'{d0}0.003_s43', 'value', 10000)} from "
        f"step 10k, seed 44's {curve_range('paper_protocol', f'{d0}0.003_s44', 'value', 10000)}",
        "at 3e-3 " + " / ".join(f"{diag[f'0.003_s{s}']['accuracy']:.3f}" for s in (42, 43, 44)),
        "(" + " / ".join(f"{diag[f'0.01_s{s}']['accuracy']:.3f}" for s in (42, 43, 44))
        + f", training loss {min(train):.2f}–{max(train):.2f})"]
    missing = [w for w in wanted if w not in text]
    assert not missing, missing


def test_the_class_preset_prose_is_recounted():
    text = section("## The class preset")
    times = {}
    with open(os.path.join(RUNS, "class_preset", "command_times.tsv")) as f:
        for line in f:
            if not line.startswith("#"):
                name, seconds = line.split()[:2]
                times.setdefault(name.rsplit("_s", 1)[0], []).append(int(seconds))
    median = {k: minutes(sorted(v)[1]) for k, v in times.items()}
    d0 = times["ar_mamba_dconv0"]
    wanted = [f"(medians: attention {median['ar_attention']}, Based {median['ar_based']}, Mamba "
              f"{median['ar_mamba_dconv4']}, without its conv {median['ar_mamba_dconv0']} and "
              f"{median['ar_mamba_dconv1']} (d_conv 1), on ATR {median['atr_easy_mamba_dconv0']})",
              f"({minutes(min(d0))}–{minutes(max(d0))} min)",
              f"With `--dconv 1` it takes {median['ar_mamba_dconv1']} min"]
    assert max(sorted(v)[1] for v in times.values()) == sorted(d0)[1]  # "the one over 3 minutes"
    eight = [metrics("diagnostics", f"class_ar_mamba_8pairs_s{s}") for s in (42, 43, 44)]
    wanted += [f"accuracy {eight[0]['accuracy']:.3f}", f"seed 43 {eight[1]['accuracy']:.3f}",
               f"but seed 44 does not learn ({eight[2]['accuracy']:.3f};"]
    missing = [w for w in wanted if w not in text]
    assert not missing, missing
    total = sum(s for v in times.values() for s in v)
    assert f"| {minutes(total, '1')} min of the two cores" in REPORT


def test_the_cost_table_gives_the_cpu_preset_times(records):
    """The CPU preset's row: median and range of the main sweeps' run minutes per task, the
    1-layer ATR runs' range, the two cores' hours, and C3's Hyena runs at d = 128 and 256."""
    from figures.sweeps import sweep_runs
    row = next(line for line in REPORT.splitlines() if line.startswith("| the CPU preset"))
    by_name = {os.path.basename(r["folder"]): r for r in records}
    names = lambda sweeps: {n for sw in sweeps for n, _ in sweep_runs(sw, "cpu", 3) if n in by_name}
    main = [by_name[n] for n in names(collect.MAIN_SWEEPS)]
    for task, words in (("ar", "AR median"), ("atr", "ATR median")):
        walls = sorted(r["wall_time_s"] for r in main if r["task"] == task)
        median = statistics.median(walls)
        assert (f"{words} {minutes(median)} min ({minutes(walls[0])}–{minutes(walls[-1])})"
                in row), task
    one = [by_name[n]["wall_time_s"] for n in names(("atr-layers",))]
    assert f"1-layer ATR (`atr-layers`) {minutes(min(one))}–{minutes(max(one))} min" in row
    hours = sum(r["wall_time_s"] for r in main) / 3600 / 2
    assert f"~{hours:.0f} h of the two cores" in row
    hyena = [r for r in records if r["arch"] == "hyena" and r["task"] == "ar"
             and r["d_model"] in (128, 256)]
    assert f"C3's {len(hyena)} Hyena runs at d = 128 and 256" in row
    total = sum(r["wall_time_s"] for r in hyena) / 60
    assert f"the {len(hyena)} Hyena runs {total:.0f} more" in row
