"""The report page of real runs of each learner: results, charts, every sample, escaping, caps, odd shapes."""

from __future__ import annotations

import html
import json
import re
from collections import Counter

import pytest
from report_helpers import PAYLOAD, copy_run, jsonl, poison

from lrmgym.report import build_report
from lrmgym.report.charts import step_offsets
from lrmgym.report.page import script_json
from lrmgym.report.rundata import read_run
from lrmgym.report.samples import MAX_TEXT_CHARS

_DATA_RE = re.compile(r"<script type='application/json' id='report-data'>(.*?)</script>", re.S)


def page_data(page: str) -> dict:
    """The JSON data block of a page."""
    found = _DATA_RE.findall(page)
    assert len(found) == 1
    return json.loads(found[0])


def _verdict(v: dict | None) -> str:
    """The verdict class the page must show for a logged verdict."""
    if v is None:
        return "unjudged"
    if v["score"] is None:
        return "ungradeable"
    return "scored" if v["correct"] is None else "correct" if v["correct"] else "incorrect"


def _expected(records: list[dict]) -> tuple[int, Counter, list[str]]:
    """Trajectories, verdict classes and component names (first seen) of group records as the files hold them."""
    verdicts, names = Counter(), []
    for rec in records:
        for t in rec["trajectories"]:
            verdicts[_verdict(t["verdict"])] += 1
            names += [c["name"] for c in (t["verdict"] or {}).get("components", []) if c["name"] not in names]
    return sum(verdicts.values()), verdicts, names


def _acc(result: dict) -> str:
    low, high = result["ci"]
    return f"{100 * result['accuracy']:.1f}% [{100 * low:.1f}, {100 * high:.1f}]"


@pytest.mark.parametrize("learner", ["grpo", "ppo", "dapo"])
def test_a_group_learners_page_has_its_results_charts_and_every_sample(make_run, learner):
    run_dir = make_run(learner)
    page = build_report(run_dir).html
    summary = json.loads((run_dir / "summary.json").read_text())
    for tag in ("before", "after"):
        for kind in ("sampled", "greedy"):
            assert _acc(summary["evals"][tag][kind]) in page, (tag, kind)
    assert "T=1, avg@2" in page and "6 held-out tasks" in page
    assert "id='chart-main'" in page and "id='chart-training'" in page
    assert html.escape((run_dir / "config.yaml").read_text(), quote=True) in page
    data = page_data(page)
    rows, verdicts, names = _expected(jsonl(run_dir / "samples.jsonl"))
    assert len(data["rows"]) == rows and Counter(r["verdict"] for r in data["rows"]) == verdicts
    assert data["components"] == names and names
    assert {g["step"] for g in data["groups"]} == set(range(1, summary["steps"] + 1))
    assert all(g["prompt"] and g["task"].startswith("math/") for g in data["groups"])
    assert all(r["adv"] is not None and r["reward"] is not None for r in data["rows"])


def test_the_judges_metrics_are_charted(make_run):
    page = build_report(make_run("grpo")).html  # judge=[accuracy,format_strict]: judge/accuracy/calls ...
    chart = page[page.index("id='chart-judges'") :]
    assert "accuracy/seconds" in chart[: chart.index("</svg>")]
    assert "accuracy/calls" not in chart[: chart.index("</svg>")]  # 16 at every step: said, not drawn flat
    assert "accuracy/calls = 16" in page[page.index("id='judge-constant'") :].split("</p>")[0]
    assert page_data(page)["components"] == ["accuracy", "format_strict"]


def test_a_reason_maxxer_page_shows_decision_tokens_and_the_prompts_from_its_rollouts(make_run):
    run_dir = make_run("reason_maxxer")
    page = build_report(run_dir).html
    data = page_data(page)
    records = jsonl(run_dir / "samples.jsonl")
    prompts = {r["task_id"]: r["prompt"] for r in jsonl(run_dir / "reason_maxxer" / "rollouts.jsonl")}
    assert len(data["rows"]) == len(records)
    for row, rec in zip(data["rows"], records, strict=True):
        group = data["groups"][row["g"]]
        assert row["text"] == rec["completion"] and row["dec"] == rec["decisions"]
        assert row["verdict"] == ("correct" if rec["correct"] else "incorrect")
        assert group["prompt"] == prompts[rec["task_id"]] and group["step"] == rec["step"]
    assert data["decisions"] == any(r["decisions"] for r in records)
    assert _acc(json.loads((run_dir / "summary.json").read_text())["evals"]["after"]["sampled"]) in page


def test_a_staged_run_reads_every_stage_and_says_which_logged_no_samples(make_run):
    run_dir = make_run("ring_zero")
    report = build_report(run_dir)
    page, data = report.html, page_data(report.html)
    assert data["parts"] == ["01-rl1", "02-sd", "03-rl2"]
    for i, stage in ((0, "01-rl1"), (2, "03-rl2")):
        rows, verdicts, _ = _expected(jsonl(run_dir / "stages" / stage / "samples.jsonl"))
        mine = [r for r in data["rows"] if data["groups"][r["g"]]["part"] == i]
        assert len(mine) == rows and Counter(r["verdict"] for r in mine) == verdicts
    pairs = len((run_dir / "stages/02-sd/corpus.jsonl").read_text().splitlines())
    assert f"stage 02-sd logged no samples.jsonl (it trained on corpus.jsonl: {pairs} prompt/target pairs)." in page
    assert "Stages, in order" in page
    for stage in json.loads((run_dir / "summary.json").read_text())["stages"]:
        assert _acc(stage["after"]["sampled"]) in page
    steps = [json.loads((run_dir / "stages" / s / "summary.json").read_text())["steps"] for s in data["parts"]]
    assert step_offsets(report.run.parts) == [0, steps[0], steps[0] + steps[1]]
    charts = page[page.index("id='chart-main'") :]
    assert ">sd</text>" in charts and ">rl2</text>" in charts  # the stage boundaries are named
    assert "id='chart-judges'" in page


def test_the_page_needs_nothing_from_the_network(make_run):
    page = build_report(make_run("grpo")).html
    assert not re.search(r"""(?:src|href|action)\s*=\s*["']?\s*(?:https?:|//)""", page, re.I)
    assert "@import" not in page and "url(http" not in page.lower()
    assert "default-src 'none'" in page  # and the CSP forbids it anyway


def test_script_json_escapes_what_could_end_the_script_element():
    text = script_json({"a": "</script><!--&\u2028\u2029"})
    assert text == '{"a":"\\u003c/script\\u003e\\u003c!--\\u0026\\u2028\\u2029"}'
    assert json.loads(text) == {"a": "</script><!--&\u2028\u2029"}


def test_model_output_is_escaped_everywhere_it_lands(make_run, tmp_path):
    run_dir = copy_run(make_run("grpo"), tmp_path / "evil")
    poison(run_dir)
    page = build_report(run_dir).html
    assert page.count("<script") == 2 and page.count("</script>") == 2  # the data block and the page's own
    assert "<img" not in page and "alert(1)</script>" not in page
    assert "\u2028" not in page and "\u2029" not in page
    assert "&lt;/script&gt;&lt;script&gt;alert(1)" in page  # the config's comment and the column header, as text
    data = page_data(page)
    (evil,) = [r for r in data["rows"] if r["text"].startswith("xss-marker")]
    assert evil["text"] == f"xss-marker {PAYLOAD}" and evil["reason"] == PAYLOAD and evil["parsed"] == PAYLOAD
    group = data["groups"][evil["g"]]
    assert group["prompt"] == PAYLOAD and group["task"] == f"evil/{PAYLOAD}" and group["answer"] == PAYLOAD
    assert f"judge{PAYLOAD}" in data["components"]


def test_a_large_run_embeds_whole_groups_evenly_spread_with_the_first_and_last(make_run, tmp_path):
    run_dir = copy_run(make_run("grpo"), tmp_path / "big")
    record = jsonl(run_dir / "samples.jsonl")[0]
    g = len(record["trajectories"])
    with open(run_dir / "samples.jsonl", "w") as f:
        for i in range(500):
            f.write(json.dumps({**record, "step": i // 2 + 1}) + "\n")
    report = build_report(run_dir, max_rows=100 * g)
    data = page_data(report.html)
    assert len(data["rows"]) == 100 * g and Counter(r["g"] for r in data["rows"]) == dict.fromkeys(range(100), g)
    steps = [grp["step"] for grp in data["groups"]]
    assert steps[0] == 1 and steps[-1] == 250 and steps == sorted(steps)
    note = (
        f"{100 * g} of {500 * g} logged trajectories are embedded: 100 of the 500 logged groups, evenly spread over "
        "steps 1–250 (the first and the last kept), to keep the page a few MB. `lrmgym report --max-samples N` "
        "embeds up to N."
    )
    assert report.samples.note == note and html.escape(note) in report.html
    tenth = -(-len((run_dir / "samples.jsonl").read_bytes()) // 10)  # a tenth of the file's bytes, rounded up
    assert len(page_data(build_report(run_dir, max_bytes=tenth).html)["groups"]) == 50  # the byte cap


def test_a_long_text_is_cut_with_a_marker(make_run, tmp_path):
    run_dir = copy_run(make_run("grpo"), tmp_path / "long")
    record = jsonl(run_dir / "samples.jsonl")[0]
    record["trajectories"][0]["turns"][0]["text"] = "x" * (MAX_TEXT_CHARS + 500)
    (run_dir / "samples.jsonl").write_text(json.dumps(record) + "\n")
    text = page_data(build_report(run_dir).html)["rows"][0]["text"]
    assert text == "x" * MAX_TEXT_CHARS + "\n… [500 more characters not shown]"


def test_odd_shapes_become_rows(make_run, tmp_path):
    """Chat prompts, multi-turn episodes, ungradeable, unjudged and scored verdicts, and an unknown record."""
    run_dir = copy_run(make_run("grpo"), tmp_path / "odd")
    base = jsonl(run_dir / "samples.jsonl")[0]
    t = base["trajectories"][0]
    episode = [{"role": "policy", "text": "try 1"}, {"role": "env", "text": "wrong"}, {"role": "policy", "text": "2"}]
    records = [
        {**base, "prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1?"}],
         "trajectories": [
             {**t, "turns": episode},
             {**t, "verdict": {**t["verdict"], "score": None, "correct": None}, "reward": None},
             {**t, "verdict": None},
             {**t, "verdict": {**t["verdict"], "correct": None, "score": 0.25}},
         ]},
        {"step": 9, "task_id": "x/1", "something": [1, 2]},
    ]  # fmt: skip
    (run_dir / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    data = page_data(build_report(run_dir).html)
    assert data["groups"][0]["prompt"] == "system: be brief\nuser: 1+1?"
    assert data["rows"][0]["text"] == "▸ policy\ntry 1\n▸ env\nwrong\n▸ policy\n2"
    assert [r["verdict"] for r in data["rows"]] == ["correct", "ungradeable", "unjudged", "scored", "unjudged"]
    assert data["rows"][1]["reward"] is None
    assert data["rows"][4]["text"] == '{"something": [1, 2]}' and data["groups"][1]["step"] == 9


def test_a_run_that_has_not_finished_still_gets_a_page(make_run, tmp_path):
    run_dir = copy_run(make_run("grpo"), tmp_path / "running")
    (run_dir / "summary.json").unlink()
    page = build_report(run_dir).html
    assert "No summary.json: the run has not finished (or was killed)" in page
    assert "No held-out evaluation was recorded" in page and "id='chart-main'" in page
    assert len(read_run(run_dir).parts[0].metrics) == 3
