"""The report's numbers and verdicts are those of the committed runs: recounted from
figures/runs, they match the generated tables (figures/runs/numbers.md, runs/cpu_preset/summary.md),
and the prose of figures/README.md and README.md quotes them."""
import os
import re

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
        assert f.read() == collect.NUMBERS_HEAD + collect.numbers_table(items)
    table = "\n\n".join(filter(None, (collect.summary_table(records),
                                      collect.dynamics_table(records))))
    with open(os.path.join(RUNS, "cpu_preset", "summary.md")) as f:
        assert f.read() == table + "\n"


def test_the_report_quotes_every_accuracy_and_attrib_it_recounts(items):
    # every recounted accuracy (mean ± sd) and Attrib triple of the claims is in the report
    quoted = [ours for name, ours, _, _ in items if name.startswith(("C", "D.", "5.3"))
              and ("±" in ours or re.fullmatch(r"[-0-9. /]+", ours))]
    missing = [q for q in quoted if q.replace("-0.00", "0.00") not in REPORT.replace("-0.00", "0.00")
               and q not in README]
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
        line = next((l for l in REPORT.splitlines() if l.startswith("| ")
                     and accuracy in l and verdicts in l), None)
        assert line is not None, (name, ours)
        assert all(x == "-" or x in line for x in (attribs, conv)), (name, ours)
        assert same in ("-", "same"), (name, ours)  # the class preset's verdict is the CPU preset's
