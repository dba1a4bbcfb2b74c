"""The report page: one self-contained HTML file built from a :class:`~lrmgym.report.rundata.RunData`.

Everything in a run directory that came from a model (prompts, completions, parsed answers, reasons) is
untrusted. It reaches the page two ways, each escaped for where it lands:

- as HTML text (the config, the summary's values): :func:`html.escape`, quotes included;
- as data in ``<script type="application/json">``: :func:`script_json` escapes ``<``, ``>``, ``&`` and U+2028/9,
  so no text can close the element or start markup, and the page's script renders it with ``textContent``.

A Content-Security-Policy allows the page's own script only (by hash), fetches nothing and runs no inline event
handler, so even markup that slipped through could neither execute nor phone home.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from collections import Counter
from typing import Any

from lrmgym.report import assets
from lrmgym.report.charts import (
    CRITIC_PANELS,
    JUDGE_PREFIX,
    TRAINING_PANELS,
    chart_svg,
    constant_judge_metrics,
    judge_panels,
    main_panels,
)
from lrmgym.report.rundata import RunData
from lrmgym.report.samples import VERDICTS, SampleTable

__all__ = ["render_page", "script_json"]

_SUMMARY_KEYS = {"status", "learner", "steps", "steps_planned", "train_wall_s", "generations", "evals", "last10",
                 "run_dir", "plot", "stages"}  # fmt: skip
"""Summary keys the page shows in its own places; any other is the learner's and shown as it is."""


def _esc(value: Any) -> str:
    """``value`` as HTML text (U+2028/9 as references too, so that no raw line separator is anywhere in the page)."""
    return html.escape(str(value), quote=True).replace("\u2028", "&#x2028;").replace("\u2029", "&#x2029;")


def script_json(value: Any) -> str:
    r"""``value`` as JSON that is safe inside ``<script type="application/json">``.

    ``<``, ``>`` and ``&`` become ``\u003c``, ``\u003e`` and ``\u0026`` (so ``</script>`` and ``<!--`` cannot
    appear), and U+2028/U+2029 are escaped too (JavaScript line terminators). ``JSON.parse`` restores them all.
    """
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for char, escape in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"), ("\u2028", "\\u2028"),
                         ("\u2029", "\\u2029")):  # fmt: skip
        text = text.replace(char, escape)
    return text


# ------------------------------------------------------------------------------------------------ formatting
def _pct(x: Any) -> str:
    return f"{100 * x:.1f}%" if isinstance(x, (int, float)) and not isinstance(x, bool) else "–"


def _acc(result: Any) -> str:
    if not isinstance(result, dict) or not isinstance(result.get("accuracy"), (int, float)):
        return "–"
    ci = result.get("ci")
    if isinstance(ci, list) and len(ci) == 2 and all(isinstance(c, (int, float)) for c in ci):
        return f"{_pct(result['accuracy'])} [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"
    return _pct(result["accuracy"])


def _tokens(result: Any) -> str:
    value = result.get("mean_tokens") if isinstance(result, dict) else None
    return f"{value:.1f}" if isinstance(value, (int, float)) else "–"


def _change(before: Any, after: Any, key: str, scale: float, unit: str) -> str:
    b = before.get(key) if isinstance(before, dict) else None
    a = after.get(key) if isinstance(after, dict) else None
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return "<td class='num'>–</td>"
    delta = round(scale * (a - b), 1) + 0.0  # + 0.0: no "-0.0"
    cls = "" if key != "accuracy" or delta == 0 else "up" if delta > 0 else "down"
    return f"<td class='num {cls}'>{delta:+.1f}{unit}</td>"


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return "–"
    minutes, s = divmod(int(round(seconds)), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours} h {m} min" if hours else f"{m} min {s} s" if m else f"{seconds:.1f} s"


def _sampled_label(run: RunData, evals: dict[str, Any]) -> str:
    temperature = run.section("eval").get("temperature")
    sampled = [e["sampled"] for e in evals.values() if isinstance(e, dict) and isinstance(e.get("sampled"), dict)]
    n = sampled[0].get("n") if sampled else None
    t = f"T={temperature:g}" if isinstance(temperature, (int, float)) else "sampled"
    return f"{t}, avg@{n}" if n else t


# ------------------------------------------------------------------------------------------------ sections
def _header(run: RunData) -> str:
    summary, learner = run.summary or {}, run.section("learner")
    policy, env = run.section("policy"), run.section("env")
    judges = run.config.get("judge")
    facts = [
        ("run directory", str(run.path)),
        ("learner", summary.get("learner") or learner.get("kind")),
        ("env", env.get("id")),
        ("policy", " ".join(str(policy[k]) for k in ("kind", "model", "path") if policy.get(k))),
        ("judges", ", ".join(judges) if isinstance(judges, dict) and judges else None),
        ("stages", ", ".join(p.name for p in run.parts) if run.staged else None),
        ("status", summary.get("status")),
        ("steps", summary.get("steps")),
        ("training time", _duration(summary.get("train_wall_s")) if "train_wall_s" in summary else None),
        ("generations", summary.get("generations")),
        ("lrmgym", (run.record or {}).get("lrmgym")),
        ("config sha256", (run.record or {}).get("config_sha256")),
    ]
    rows = "".join(f"<dt>{_esc(k)}</dt><dd>{_esc(v)}</dd>" for k, v in facts if v not in (None, ""))
    return f"<h1>Run report: {_esc(run.path.name)}</h1><dl class='facts'>{rows}</dl>"


def _notes(notes: list[str]) -> str:
    if not notes:
        return ""
    return "<ul class='notes'>" + "".join(f"<li>{_esc(n)}</li>" for n in notes) + "</ul>"


def _eval_table(run: RunData, evals: Any, caption: str) -> str:
    """The held-out evaluations (before, intermediate, after) and the change from before to after."""
    if not isinstance(evals, dict):
        return ""
    entries = [(tag, e) for tag, e in evals.items() if isinstance(e, dict) and ("sampled" in e or "greedy" in e)]
    if not entries:
        return ""
    order = {"before": 0, "after": 2}
    entries.sort(key=lambda te: (te[1].get("step") if isinstance(te[1].get("step"), int) else 0, order.get(te[0], 1)))
    results = [e[k] for _, e in entries for k in ("sampled", "greedy") if isinstance(e.get(k), dict)]
    tasks = results[0].get("tasks") if results else None
    head = (
        f"<tr><th>evaluation</th><th class='num'>step</th><th class='num'>{_esc(_sampled_label(run, evals))}</th>"
        "<th class='num'>tokens</th><th class='num'>greedy</th><th class='num'>tokens</th></tr>"
    )
    body = "".join(
        f"<tr><td>{_esc(tag)}</td><td class='num'>{_esc(e.get('step', ''))}</td>"
        f"<td class='num'>{_esc(_acc(e.get('sampled')))}</td><td class='num'>{_esc(_tokens(e.get('sampled')))}</td>"
        f"<td class='num'>{_esc(_acc(e.get('greedy')))}</td><td class='num'>{_esc(_tokens(e.get('greedy')))}</td></tr>"
        for tag, e in entries
    )
    before, after = evals.get("before"), evals.get("after")
    if isinstance(before, dict) and isinstance(after, dict):
        cells = "".join(
            _change(before.get(kind), after.get(kind), key, scale, unit)
            for kind in ("sampled", "greedy")
            for key, scale, unit in (("accuracy", 100.0, " pts"), ("mean_tokens", 1.0, ""))
        )
        body += f"<tr><th>change</th><td></td>{cells}</tr>"
    what = f"{tasks} held-out tasks, " if tasks else ""
    return (
        f"<table class='grid'><caption>{_esc(caption)} ({_esc(what)}accuracy with its 95% interval; tokens: mean "
        f"completion length)</caption>{head}{body}</table>"
    )


def _stage_table(run: RunData) -> str:
    stages = (run.summary or {}).get("stages")
    if not isinstance(stages, list):
        stages = [{"stage": p.label, **(p.summary or {})} for p in run.parts]
    head = (
        "<tr><th>#</th><th>stage</th><th>started from</th><th>status</th><th class='num'>steps</th>"
        "<th class='num'>before (sampled)</th><th class='num'>after (sampled)</th><th class='num'>change</th>"
        "<th class='num'>before (greedy)</th><th class='num'>after (greedy)</th><th class='num'>change</th>"
        "<th class='num'>training time</th></tr>"
    )
    body = ""
    for i, s in enumerate(x for x in stages if isinstance(x, dict)):
        evals = s.get("evals") if isinstance(s.get("evals"), dict) else s
        before, after = evals.get("before") or {}, evals.get("after") or {}
        cells = ""
        for kind in ("sampled", "greedy"):
            cells += "".join(f"<td class='num'>{_esc(_acc(e.get(kind)))}</td>" for e in (before, after))
            cells += _change(before.get(kind), after.get(kind), "accuracy", 100.0, " pts")
        body += (
            f"<tr><td class='num'>{i + 1}</td><td>{_esc(s.get('stage', ''))}</td><td>{_esc(s.get('start', ''))}</td>"
            f"<td>{_esc(s.get('status', ''))}</td><td class='num'>{_esc(s.get('steps', ''))}</td>{cells}"
            f"<td class='num'>{_esc(_duration(s.get('train_wall_s')))}</td></tr>"
        )
    return f"<table class='grid'><caption>Stages, in order</caption>{head}{body}</table>"


def _results(run: RunData) -> str:
    summary = run.summary or {}
    out = _eval_table(run, summary.get("evals"), "The whole run: before and after training")
    if run.staged:
        out += _stage_table(run)
        for part in run.parts:
            table = _eval_table(run, (part.summary or {}).get("evals"), f"Stage {part.name}")
            if table:
                out += f"<details><summary>evaluations of stage {_esc(part.name)}</summary>{table}</details>"
    if not out:
        out = "<p>No held-out evaluation was recorded (summary.json has no evals).</p>"
    last10 = summary.get("last10")
    if isinstance(last10, dict) and last10:
        cells = "".join(
            f"<tr><td>{_esc(k)}</td><td class='num'>{v:.4g}</td></tr>"
            for k, v in last10.items()
            if isinstance(v, (int, float))
        )
        out += f"<table class='grid'><caption>Mean of the last 10 training steps</caption>{cells}</table>"
    return "<h2>Results</h2>" + out


def _charts(run: RunData) -> str:
    if not any(p.metrics for p in run.parts):
        return "<h2>Metrics</h2><p>No metrics were logged yet (metrics.jsonl is empty).</p>"
    out = "<h2>Metrics over steps</h2>"
    for name, title, panels, cols in (
        ("main", "Reward, accuracy, length, KL", main_panels(run.parts), 2),
        ("training", "Optimisation", TRAINING_PANELS, 4),
        ("critic", "Critic (value model)", CRITIC_PANELS, 3),
        ("judges", "Judge metrics", judge_panels(run.parts), 4),
    ):
        svg = chart_svg(run.parts, panels, name, cols)
        if svg is not None:
            out += f"<h3>{_esc(title)}</h3><div class='chart' id='chart-{name}'>{svg}</div>"
    constant = constant_judge_metrics(run.parts)
    if constant:  # flat lines are not drawn: their one value is said instead
        listed = ", ".join(f"{k.removeprefix(JUDGE_PREFIX)} = {v:g}" for k, v in constant.items())
        out += f"<p class='note' id='judge-constant'>Judge metrics with one value at every step: {_esc(listed)}.</p>"
    return out


def _sample_notes(run: RunData, table: SampleTable) -> list[str]:
    notes = [table.note] if table.note else []
    for part in run.parts:
        if part.samples is None:
            where = f"stage {part.name}" if part.name else "This run"
            corpus = part.folder / "corpus.jsonl"
            trained = ""
            if corpus.is_file():
                with open(corpus, "rb") as f:
                    trained = f" (it trained on corpus.jsonl: {sum(1 for _ in f)} prompt/target pairs)"
            notes.append(f"{where} logged no samples.jsonl{trained}.")
    return notes


_FORMAT_COLUMN = "format ok (verifier)"
"""The column of the env verifier's own answer-format check (beside the judges' scores, one of which may be a
format judge)."""


def column_names(fixed: list[str], components: list[str], after: list[str]) -> list[str]:
    """The sample table's headers: ``fixed``, one per judge component, ``after``; no two alike.

    A component named like another column (a judge called ``reward``, ``verdict``...) is shown as ``NAME (judge)``,
    and a repeat after that gets a number, so a reader never has to guess which of two equal headers is which.
    """
    taken = {n.casefold() for n in [*fixed, *after]}
    names = list(fixed)
    for component in components:
        name = component if component.casefold() not in taken else f"{component} (judge)"
        base, k = name, 2
        while name.casefold() in taken:
            name, k = f"{base} {k}", k + 1
        taken.add(name.casefold())
        names.append(name)
    return names + list(after)


def _samples(run: RunData, table: SampleTable) -> tuple[str, str]:
    """The samples section and its JSON data block."""
    counts = Counter(r["verdict"] for r in table.rows)
    verdicts = "".join(f"<option value='{v}'>{v} ({counts[v]})</option>" for v in VERDICTS if counts[v])
    stage = ""
    if len(run.parts) > 1:
        options = "".join(f"<option value='{i}'>{_esc(p.name)}</option>" for i, p in enumerate(run.parts))
        stage = f"<label>stage <select id='filter-stage'><option value=''>all</option>{options}</select></label>"
    controls = (
        "<div class='controls'>"
        "<input type='search' id='filter-text' placeholder='search prompts, completions, answers, task ids' "
        "aria-label='search'>"
        f"<label>verdict <select id='filter-verdict'><option value=''>all</option>{verdicts}</select></label>"
        "<label>step from <input type='number' id='filter-step-min'></label>"
        "<label>to <input type='number' id='filter-step-max'></label>"
        f"{stage}"
        "<label>order <select id='filter-sort'><option value='step-asc'>step, oldest first</option>"
        "<option value='step-desc'>step, newest first</option><option value='adv-desc'>advantage, highest</option>"
        "<option value='adv-asc'>advantage, lowest</option><option value='reward-desc'>reward, highest</option>"
        "<option value='reward-asc'>reward, lowest</option></select></label>"
        "<span id='samples-count'></span></div>"
    )
    cols = ["<col class='c-step'>"] + (["<col class='c-stage'>"] if stage else [])
    cols += ["<col class='c-prompt'>", "<col class='c-text'>", "<col class='c-verdict'>"]
    cols += ["<col class='c-num'>"] * (2 + len(table.components) + table.has_format)
    cols += ["<col>"] if table.has_decisions else []
    fixed = ["step", *(["stage"] if stage else []), "task / prompt", "completion", "verdict", "reward", "advantage"]
    after = [*([_FORMAT_COLUMN] if table.has_format else []), *(["decision tokens"] if table.has_decisions else [])]
    names = column_names(fixed, table.components, after)
    numeric = {"step", "reward", "advantage"}
    heads = [f"<th class='num'>{_esc(n)}</th>" if n in numeric else f"<th>{_esc(n)}</th>" for n in fixed]
    heads += [f"<th class='num'>{_esc(n)}</th>" for n in names[len(fixed) : len(fixed) + len(table.components)]]
    heads += [f"<th>{_esc(n)}</th>" for n in after]
    pager = (
        "<div class='pager'><button type='button' id='page-prev'>previous</button>"
        "<button type='button' id='page-next'>next</button><span id='page-where'></span></div>"
    )
    section = (
        f"<h2>Samples</h2>{_notes(_sample_notes(run, table))}"
        f"<p>{len(table.rows)} trajectories of {table.logged_groups} logged groups; judge columns hold each "
        "component's score (hover for its reason).</p>"
        f"{controls}<table class='samples' id='samples'><colgroup>{''.join(cols)}</colgroup>"
        f"<thead><tr>{''.join(heads)}</tr></thead><tbody id='samples-body'></tbody></table>{pager}"
        "<noscript><p>The sample table needs JavaScript.</p></noscript>"
    )
    n = len(table.components)
    data = {
        "page": assets.PAGE_ROWS,
        "parts": [p.name for p in run.parts],
        "components": table.components,
        "groups": table.groups,
        "rows": [
            {**r, "comp": [r["comp"].get(i) for i in range(n)], "why": [r["why"].get(i, "") for i in range(n)]}
            for r in table.rows
        ],
        "format": table.has_format,
        "decisions": table.has_decisions,
    }
    return section, script_json(data)


def _config(run: RunData) -> str:
    out = "<h2>Configuration</h2>"
    if run.config_text is not None:
        out += f"<details open><summary>config.yaml (resolved)</summary><pre>{_esc(run.config_text)}</pre></details>"
    extra = {k: v for k, v in (run.summary or {}).items() if k not in _SUMMARY_KEYS}
    if extra:
        dump = json.dumps(extra, indent=2, sort_keys=True, default=str)
        out += f"<details><summary>more of summary.json</summary><pre>{_esc(dump)}</pre></details>"
    return out


def render_page(run: RunData, table: SampleTable) -> str:
    """The whole report page of ``run`` with the sample table ``table``."""
    samples, data = _samples(run, table)
    digest = base64.b64encode(hashlib.sha256(assets.SCRIPT.encode()).digest()).decode()
    csp = f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; img-src data:"
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='Content-Security-Policy' content=\"{csp}\">"
        "<meta name='viewport' content='width=device-width, initial-scale=1'><link rel='icon' href='data:,'>"
        f"<title>lrmgym report: {_esc(run.path.name)}</title><style>{assets.STYLE}</style></head><body>"
        f"{_header(run)}{_notes(run.notes)}{_results(run)}{_charts(run)}{samples}{_config(run)}"
        f"<script type='application/json' id='report-data'>{data}</script>"
        f"<script>{assets.SCRIPT}</script></body></html>\n"
    )
