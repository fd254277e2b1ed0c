"""What a newcomer reads first (issue 23, "The first hour"), without training: the verdict's
wording on ties and zero differences, the one-paragraph verdict the report, the parent run
and the terminal lead with, the quality-versus-cost figure's title and points, the plugin
skeleton's wording and lint, `--set` errors, the cached listing under tracing, and study
names without their profile suffix. (The MLflow UI itself: tests/test_ui.py.)"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import optuna
import pytest
import scipy.stats
from test_report import candidate, protocol
from text import flat

from harness.cli import scaffold
from harness.cli.main import main
from harness.errors import HarnessError
from harness.keys import Attr
from harness.report.document import document
from harness.report.render import headline, ranked_line, render_html, render_markdown, short_verdict
from harness.report.verdict import analyze

ROOT = Path(__file__).resolve().parent.parent


# -- 7: ties and a difference of exactly zero ------------------------------------------------------
def tied() -> list:
    """sinusoidal listed first in the study, rope equal on every seed: a tie on the mean."""
    values = {1: 0.9, 2: 0.92, 3: 0.91, 4: 0.93, 5: 0.9, 6: 0.94, 7: 0.92}
    return [candidate("sinusoidal", values), candidate("rope", dict(values)),
            candidate("nope", {s: v - 0.4 for s, v in values.items()})]


def test_a_tie_names_the_candidate_the_table_lists_first_and_says_it_is_tied():
    results = tied()
    proto = protocol(7, baseline="sinusoidal")
    verdict = analyze(results, proto)
    assert verdict.order[:2] == ["rope", "sinusoidal"]  # equal means: by name
    assert verdict.best == verdict.order[0] == "rope"
    md = render_markdown(document(results, verdict, proto))
    assert "the best mean (rope, tied with sinusoidal)" in md
    assert "best mean (sinusoidal)" not in md


def test_a_difference_of_exactly_zero_reads_no_difference_observed():
    results = tied()
    proto = protocol(7, baseline="sinusoidal")
    verdict = analyze(results, proto)
    sinusoidal = next(r for r in results if r.name == "sinusoidal")
    assert sinusoidal.vs_best is not None and sinusoidal.vs_best.paired.mean_difference == 0
    assert math.isinf(sinusoidal.vs_best.seeds_needed)
    md = render_markdown(document(results, verdict, proto))
    assert "sinusoidal: none: no difference observed" in md  # the verdict's sentence
    comparisons = md.split("## Comparisons")[1].split("\n\n")[1]
    row = next(line for line in comparisons.splitlines() if line.startswith("| sinusoidal | rope"))
    assert row.rstrip(" |").endswith("none: no difference observed")
    assert "more than 10,000" not in row


def test_a_difference_that_is_float32_rounding_reads_no_difference_observed():
    """Seeds logged as float32 (0.525, 0.475, 0.5 against 0.5 on each seed) average to about
    -1e-8, not 0 (seen in lra_pathfinder's report): rounding, not a difference."""
    f32 = [float(np.float32(v)) for v in (0.525, 0.475, 0.5)]
    even = {1: 0.5, 2: 0.5, 3: 0.5}
    results = [candidate("flat", even), candidate("wobbly", dict(zip((1, 2, 3), f32, strict=True)))]
    proto = protocol(3, baseline="flat")
    verdict = analyze(results, proto)
    wobbly = next(r for r in results if r.name == "wobbly")
    assert wobbly.vs_best is not None
    assert 0 < abs(wobbly.vs_best.paired.mean_difference) < 1e-7  # not exactly zero
    md = render_markdown(document(results, verdict, proto))
    assert "wobbly: none: no difference observed" in md
    assert "more than 10,000" not in md


# -- 5: the verdict first, in one paragraph ----------------------------------------------------------
def test_the_verdict_paragraph_says_which_by_how_much_and_how_sure():
    results = tied()
    proto = protocol(7, baseline="sinusoidal")
    verdict = analyze(results, proto)
    text = headline(results, verdict, proto)
    assert text.startswith("val/acc @16, mean over 7 confirmation seed(s) with its 95% Student t")
    assert "**Best: rope, sinusoidal** (not resolved apart)" in text
    nope = next(r for r in results if r.name == "nope")
    d = nope.vs_best.paired
    assert f"nope {nope.mean:.4g} (Δ = {d.mean_difference:.4g} [" in text and ": resolved)" in text
    assert math.isclose(d.mean_difference, -0.4)
    line = ranked_line(results, verdict, proto)
    assert line.index("**1. rope**") < line.index("**1. sinusoidal**") < line.index(" 3. nope ")
    assert line.startswith("Ranked by val/acc @16 (mean [95% Student t interval] over 7")
    values = np.array(list(results[1].values().values()), dtype=np.float64)
    low, high = scipy.stats.t.interval(0.95, len(values) - 1, loc=values.mean(),
                                       scale=scipy.stats.sem(values))  # the reference interval
    assert short_verdict(results, verdict) == (
        f"best: rope, sinusoidal (rope {values.mean():.4g} [{low:.4g}, {high:.4g}])")
    html = render_html(document(results, verdict, proto), "t")
    assert "<strong>Best: rope, sinusoidal</strong>" in html and "**" not in html
    # the report's verdict section opens with it
    md = render_markdown(document(results, verdict, proto))
    assert md.split("## Verdict\n\n")[1].startswith(text)


# -- 6: the quality-versus-cost figure ---------------------------------------------------------------
def test_the_front_figure_title_fits_and_no_point_hides_another(tmp_path, monkeypatch):
    """Candidates of equal cost (two position schemes at the same parameter count) are drawn
    side by side, each with its own marker; the title is wrapped inside the figure."""
    from harness.report import figures
    from harness.run import plots

    kept = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, path, dpi=110: kept.append(fig) or Path(path))
    results = tied()  # every candidate has 10,000 parameters
    proto = protocol(7, front_cost="params")
    verdict = analyze(results, proto)
    assert figures.front(None, results, verdict, proto, {"sinusoidal": "C0", "rope": "C1", "nope": "C2"},
                         tmp_path / "f.png") is not None
    fig = kept[0]
    ax = fig.axes[0]
    means = [c.lines[0] for c in ax.containers]  # each candidate's confirmed mean (errorbar)
    xs = [line.get_xdata()[0] for line in means]
    assert len(xs) == 3 and len(set(xs)) == 3  # the tied rope and sinusoidal do not overlap
    assert all(abs(x / 10_000 - 1) < 0.1 for x in xs)  # still at their cost
    assert len({line.get_marker() for line in means}) == 3
    plots.fit_titles(fig)
    fig.tight_layout()
    fig.canvas.draw()
    box, title = fig.bbox, ax.title.get_window_extent()
    assert box.x0 <= title.x0 and title.x1 <= box.x1, "the title is clipped"
    assert "side by side" in ax.get_title()


# -- 10: the plugin skeleton ---------------------------------------------------------------------------
def test_the_package_skeleton_says_an_and_keeps_the_description_in_one_place():
    files = scaffold.render("attention", "my_att", package=True)
    summary = scaffold.MODULES["attention"][0]
    holders = [path for path, text in files.items() if summary in text]
    assert holders == ["pyproject.toml"]
    assert files["README.md"].splitlines()[2].startswith("An attention plugin for attention-harness")
    assert "A attention" not in "".join(files.values())
    assert "pip install -e /path/to/attention-harness" in files["README.md"]
    assert scaffold.render("mixer", "m", package=True)["README.md"].splitlines()[2].startswith("A mixer")


def test_the_reference_examples_pass_the_skeletons_own_lint(tmp_path):
    """A plugin's project sorts `harness` with the third-party imports: every example of
    docs/plugins.md, dropped into a generated package, passes its `ruff check` (I001 failed)."""
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed")
    root = tmp_path / "harness-mine"
    root.mkdir()
    (root / "pyproject.toml").write_text(scaffold.render("attention", "mine", package=True)["pyproject.toml"])
    examples = sorted((ROOT / "docs" / "examples").glob("*.py"))
    assert len(examples) >= 5
    for example in examples:
        shutil.copy(example, root / example.name)
    lint = subprocess.run([ruff, "check", "--no-cache", "."], cwd=root,  # the skeleton's config
                          capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout
    (root / "late.py").write_text("from torch import nn\n\nfrom harness.plugin import hookimpl\n\nprint(nn, hookimpl)\n")
    assert "I001" in subprocess.run([ruff, "check", "--no-cache", "late.py"], cwd=root,
                                    capture_output=True, text=True).stdout  # it does sort imports
    docs = (ROOT / "docs" / "plugins.md").read_text()
    assert "pip install torch==2.13.0 -e /path/to/attention-harness" in docs


# -- 9: --set errors ---------------------------------------------------------------------------------------
PLUGIN = '''\
"""cos_tau: cosine attention with a temperature that must stay below 100."""

from dataclasses import dataclass

from harness.plugin import Attention, AttentionConfig, AttentionSpec, hookimpl


@dataclass
class CosTauConfig(AttentionConfig):
    init_temperature: float = 10.0

    def __post_init__(self) -> None:
        if self.init_temperature >= 100:
            raise ValueError("init_temperature must be below 100, where the softmax saturates")


class CosTauAttention(Attention):
    """Dot-product attention (a stand-in)."""

    def __init__(self, config: CosTauConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads, dropout=config.dropout, bias=config.bias)


@hookimpl
def harness_register_attention(register):
    register(AttentionSpec(name="cos_tau", build=CosTauAttention))
'''


def test_set_errors_name_the_field_without_validator_internals(tmp_path, capsys):
    path = tmp_path / "cos_tau.py"
    path.write_text(PLUGIN)
    assert main(["check", "--plugin", str(path), "--set", "init_temperature=200"]) == 2
    err = flat(capsys.readouterr().err)
    assert "init_temperature must be below 100, where the softmax saturates" in err
    for internal in ("Value error", "{'init_temperature': 200}", "'.:", "..", "Traceback"):
        assert internal not in err, internal
    assert "attention 'cos_tau'" in err
    # a field's own type error still names the field and the value given
    assert main(["check", "--plugin", str(path), "--set", "init_temperature=hot"]) == 2
    err = flat(capsys.readouterr().err)
    assert "init_temperature:" in err and "(got 'hot')" in err and "Value error" not in err


# -- 12: tracing the plugins' hooks never reads the cached listing ---------------------------------------
def test_tracing_implies_a_fresh_listing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    assert main(["list"]) == 0  # fills the cache
    capsys.readouterr()
    monkeypatch.setenv("HARNESS_TRACE_PLUGINS", "1")
    for _ in range(2):  # the cache is there: tracing loads the plugins anyway, every time
        assert main(["list"]) == 0
        err = capsys.readouterr().err
        assert "harness_register_attention" in err


# -- 8: a study name without its profile suffix ----------------------------------------------------------
def record(storage: optuna.storages.BaseStorage, name: str, profile: str | None) -> None:
    study = optuna.create_study(study_name=f"{name}/_record", storage=storage)
    study.set_user_attr(Attr.RECORD, {"name": name, "config": {"profile": profile}})


def test_a_study_is_found_by_its_files_name_when_one_profile_ran(tmp_path):
    from harness.study.storage import open_study, resolve_name

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'o.db'}")
    record(storage, "quickstart-cpu", "cpu")
    record(storage, "attention", None)
    record(storage, "attention-variants-cpu", "cpu")
    assert resolve_name(storage, "quickstart") == "quickstart-cpu"
    assert resolve_name(storage, "quickstart-cpu") == "quickstart-cpu"
    assert resolve_name(storage, "attention") == "attention"  # its own name wins
    assert resolve_name(storage, "attention-variants") == "attention-variants-cpu"
    assert resolve_name(storage, "quick") == "quick"  # no such study: the usual error follows
    record(storage, "quickstart-full", "full")
    with pytest.raises(HarnessError, match="ran with several profiles: quickstart-cpu, quickstart-full"):
        resolve_name(storage, "quickstart")
    with pytest.raises(HarnessError, match="several profiles"):  # every command resolves there
        open_study("quickstart", storage, "sqlite:///o.db", check_tracking=False)


# -- 11: as quiet from Python as from the CLI ----------------------------------------------------------
NOTEBOOK = '''\
import json, logging, sys
import harness
config = json.loads(sys.argv[1])
verbose = {"quiet": None, "verbose": True}[sys.argv[2]]
before = logging.root.manager.disable
result = harness.train(config, verbose=verbose)
assert logging.root.manager.disable == before, "logging settings not restored"
logging.getLogger("user").warning("the user's own warnings still show")
print("trained", result.status)
'''


@pytest.mark.slow
def test_harness_train_from_python_is_as_quiet_as_the_cli_unless_asked(tmp_path):
    """A notebook's `harness.train(...)` prints none of the libraries' lines (MLflow's INFO,
    Lightning's GPU/TPU lines, its tips, "Trainer.fit stopped"), and leaves the process's
    logging settings as it found them; `verbose=True` lets them through."""
    import json

    from test_core_train import tiny

    noise = ("GPU available", "TPU available", "Tip:", "litlogger", "`Trainer.fit` stopped",
             "Creating initial MLflow database", " INFO ")
    outputs = {}
    for mode in ("quiet", "verbose"):
        env = dict(__import__("os").environ, HARNESS_HOME=str(tmp_path / mode))
        for var in ("HARNESS_VERBOSE", "MLFLOW_LOGGING_LEVEL"):  # a CLI run in this process sets the latter
            env.pop(var, None)
        done = subprocess.run([sys.executable, "-c", NOTEBOOK, json.dumps(tiny()), mode],
                              capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        outputs[mode] = done.stdout + done.stderr
        assert "trained FINISHED" in done.stdout
    heard = [n for n in noise if n in outputs["quiet"]]
    assert not heard, f"library noise from harness.train: {heard}"
    assert "`Trainer.fit` stopped" in outputs["verbose"]  # the opt-in works (and the check can fail)
    assert "Creating initial MLflow database" in outputs["verbose"]
    assert "the user's own warnings still show" in outputs["quiet"]


# -- 1: --open where there is no display -----------------------------------------------------------------
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the display check is for Linux")
def test_open_without_a_display_prints_instead_of_starting_a_text_browser(monkeypatch, capsys):
    """Python's webbrowser falls back to a text browser in the terminal where there is no
    display: `harness ui --open` says to open the link instead (the README's first command
    ends with it, on laptops and on remote machines alike)."""
    import webbrowser

    from harness.cli import ui

    opened = []
    monkeypatch.setattr(webbrowser, "open", lambda url: opened.append(url))
    for var in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER"):
        monkeypatch.delenv(var, raising=False)
    found = [("study s: candidates ranked (confirmation runs)", "http://127.0.0.1:1/#/x")]
    ui._show(found, open_first=True)
    assert opened == [] and "open the first link in a browser yourself" in capsys.readouterr().out
    monkeypatch.setenv("BROWSER", "/bin/true")
    ui._show(found, open_first=True)
    assert opened == ["http://127.0.0.1:1/#/x"]
