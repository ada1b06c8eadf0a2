"""Hostile names cannot become markup: every name, note, reason and fingerprint field of a gate result is
text in the HTML page (autoescaped) and in the markdown summary (code spans or escaped prose, parsed here
with markdown-it as a GitHub-like renderer would), and the name checks refuse them where names are made."""

from __future__ import annotations

import json
import math
from html.parser import HTMLParser

import pytest
from markdown_it import MarkdownIt

from ci import report
from kdengine.bench import fingerprint, names

HOSTILE = [
    "verify/<script>alert(1)</script>/ctx1/T1",
    '<img src=x onerror="alert(1)">',
    "name`</td><td>`break",
    "``` fenced ```",
    "a|b|c",
    "[click](https://evil.example/x)",
    "![pixel](https://evil.example/p.png)",
    "# heading",
    "line\n## heading on a new line",
    "cr\r\n> quote",
    "@octocat please look",
    "mail admin@evil.example",
    "see #1 and GH-2",
    "<https://evil.example>",
    "www.evil.example/path",  # a valid workload name: harmless as HTML, escaped in markdown
    "javascript:alert(1)",
    "*bold* _it_ ~~del~~",
    "&lt;script&gt; entity",
    "</em></p><h1>x</h1>",
    "back\\`slash",
    "bidi \u202eevil\u202c",
    "ctrl \x00\x1b[31m",
    "$x^2$ math",
    "<!-- comment -->",
]


def hostile_result() -> dict:
    rows = []
    for i, name in enumerate(HOSTILE):
        rows.append({
            "name": name, "machine": HOSTILE[-1 - i], "verdict": ["regressed", "improved", "noisy"][i % 3],
            "unit": name, "base": 1.0, "head": float("nan") if i == 0 else 1.1, "change": 0.1,
            "history": [1.0, 2.0, "x", None, float("inf")], "reason": f"because {name}",
            "change_points": [{"commit": name}],
            "confirmation": {"note": name, "rounds": 3},  # an extra field the gate may add
            "fingerprint": {"gpu": name, "driver": name},
        })
    machines = [{"machine": m, "notes": [f"note {m}", m], "benchmarks": rows[i::4], "base": m, "head": m,
                 "fingerprint": {"cpu": m}} for i, m in enumerate(HOSTILE[:4])]
    return {"base": HOSTILE[5], "head": HOSTILE[0], "exit_code": 1, "machines": machines, "benchmarks": rows,
            "counts": {"regressed": 1, HOSTILE[1]: 2}, "attribution": HOSTILE[2]}


# --- markdown ------------------------------------------------------------------------------------------


def walk(tokens):
    for tok in tokens:
        yield tok
        yield from walk(tok.children or [])


def test_markdown_keeps_every_hostile_value_as_text():
    result = hostile_result()
    text = report.render_markdown(result)
    tokens = list(walk(MarkdownIt("commonmark").enable("table").parse(text)))
    kinds = {t.type for t in tokens}
    assert not kinds & {"link_open", "image", "html_inline", "html_block", "autolink"}, kinds
    headings = [t for t in tokens if t.type == "heading_open"]
    assert [h.tag for h in headings] == ["h2"] + ["h3"] * len(result["machines"])
    codes = {t.content for t in tokens if t.type == "code_inline"}
    for name in HOSTILE:  # each name shows in a code span, whole and on one line
        assert report.one_line(name) in codes, name
    for t in tokens:
        if t.type == "text":
            for trigger in ("@", "://", "www.", "#1"):
                pos = t.content.find(trigger)
                assert pos < 0 or t.content[pos + 1] == report.WORD_JOINER, (trigger, t.content)
    rows = [t for t in tokens if t.type == "tr_open"]
    cells = [t for t in tokens if t.type == "td_open"]
    assert len(rows) == len(result["machines"]) + len(HOSTILE)  # one header row per table + one per row
    assert len(cells) == 7 * len(HOSTILE)  # no pipe split a row


def test_markdown_renders_missing_and_unknown_fields():
    text = report.render_markdown({"machines": [{"benchmarks": [{"verdict": "strange"}, {}]}], "new_key": 1})
    assert "new\\_key: 1" in text and "| — |" in text
    assert report.render_markdown({})  # an empty result still renders


# --- HTML ----------------------------------------------------------------------------------------------


class Elements(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, list]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, attrs))

    def handle_data(self, data):
        self.text.append(data)

    def handle_comment(self, data):
        self.tags.append(("!--", [("comment", data)]))


def test_html_page_is_autoescaped():
    result = hostile_result()
    page = report.render_html(result, plot="ctx.png")
    parsed = Elements()
    parsed.feed(page)
    tags = {tag for tag, _ in parsed.tags}
    assert tags <= {"html", "head", "meta", "title", "style", "body", "h1", "p", "ul", "li", "h2", "em", "table",
                    "tr", "th", "td", "img"}, tags
    for tag, attrs in parsed.tags:
        assert not [a for a, _ in attrs if a.startswith("on")], (tag, attrs)
        if tag == "tr":
            assert dict(attrs).get("class", "") in {"", "regressed", "improved", "noisy", "other"}
    text = "".join(parsed.text)
    for name in HOSTILE[:2]:
        assert name in text  # shown as text, verbatim


def test_html_template_name_selects_autoescape():
    env = report.environment()
    assert env.get_template("commit.html.j2").render(result={"head": "ab", "machines": [
        {"machine": "<b>m</b>", "benchmarks": []}]}).count("&lt;b&gt;m&lt;/b&gt;") == 1


# --- JSON and names ------------------------------------------------------------------------------------


def test_json_is_strict(tmp_path):
    result = hostile_result()
    report.write_outputs(result, str(tmp_path / "g.json"), str(tmp_path / "g.md"), str(tmp_path / "g.html"))
    raw = (tmp_path / "g.json").read_text()
    data = json.loads(raw, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert data["machines"][0]["benchmarks"][0]["head"] is None
    assert "result.benchmarks[0].head" in data["non_finite"]
    assert not any(isinstance(v, float) and not math.isfinite(v) for v in data["benchmarks"][1]["history"])


@pytest.mark.parametrize("name", [n for n in HOSTILE if not names.WORKLOAD_RE.fullmatch(n)])
def test_name_checks_refuse_hostile_names(name):
    for check in (names.check_workload_name, names.check_machine_name, names.check_asv_name,
                  names.check_asv_param):
        with pytest.raises(ValueError, match="expected"):
            check(name)


def test_names_the_project_uses_pass():
    from kdengine.bench import workloads

    for w in workloads.all_workloads():
        names.check_workload_name(w.name)
    for machine in ("gpu-nvidia-h200-sm90", "gpu-nvidia-h200-sm90-x2", "cpu-x86_64"):
        names.check_machine_name(machine)
    for value in ("'triton_extend'", "4096", "'auto'"):
        names.check_asv_param(value)
    names.check_asv_name("bench_verify.VerifyNsplit.track_time")
    hostile_gpu = {"gpu": '<img src=x onerror="1">', "sm_count": 132, "capability": "sm_9<0"}
    assert fingerprint.machine_name(hostile_gpu) == "gpu-img-src-x-onerror-1-sm9-0"


@pytest.mark.parametrize("machine", ["gpu/<script>", "../up", ".hidden", "a b"])
def test_perf_refuses_a_hostile_machine_before_running(machine):
    import argparse

    from ci import perf

    parser = argparse.ArgumentParser()
    perf.add_parser(parser.add_subparsers())
    args = parser.parse_args(["perf", "--no-record", "--machine", machine])
    with pytest.raises(ValueError, match="^--machine: "):
        perf.main(args)
