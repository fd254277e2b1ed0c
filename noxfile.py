"""nox sessions: tests, lint, typecheck, smoke, ui (and gpu where a GPU exists).

Every session that installs the project installs ``torch==2.13.0`` first (from
``$TORCH_INDEX_URL`` when set, e.g. PyTorch's CPU index in CI), so the project's torch range
never pulls a multi-GB CUDA build by accident.

In an environment that already has the project (``pip install -e '.[dev]'``), run the
sessions there without creating virtualenvs: ``nox --no-venv --no-install -s lint typecheck``
(what ``.ci/run`` and the GitHub workflow do).
"""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True

TORCH = "torch==2.13.0"
ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


LINTED = ("harness", "plugins", "tests", "docs/examples", "noxfile.py")


def install(session: nox.Session, extras: str = "dev") -> None:
    index = os.environ.get("TORCH_INDEX_URL")
    session.install(TORCH, *(["--index-url", index] if index else []))
    session.install("-e", f".[{extras}]")


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite (CPU; PostgreSQL tests start their own server when it is installed)."""
    install(session)
    session.run("pytest", *session.posargs, env=ENV)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", *LINTED)


@nox.session
def typecheck(session: nox.Session) -> None:
    install(session)
    session.run("mypy", "harness")


@nox.session
def smoke(session: nox.Session) -> None:
    """The quickstart end to end, in a throwaway store."""
    install(session, extras="dev")
    tmp = session.create_tmp()
    session.run("harness", "list", env=ENV)
    session.run("harness", "train", "studies/copy_quickstart.yaml", "--no-progress",
                env={**ENV, "HARNESS_HOME": f"{tmp}/.harness"})
    # a plugin author's first minutes: a skeleton, checked by the conformance kit
    session.run("harness", "new-plugin", "attention", "smoke_probe", "--out", tmp, env=ENV)
    session.run("harness", "check", "--plugin", f"{tmp}/smoke_probe.py", env=ENV)


@nox.session
def ui(session: nox.Session) -> None:
    """`harness ui` after a tiny study, its deep link rendered in headless Chromium (Debian's
    ``chromium`` package): asserts the run names appear; the screenshot is left in the
    session's temporary folder."""
    install(session)
    shots = os.path.abspath(f"{session.create_tmp()}/ui")  # the tests chdir to their tmp_path
    session.run("pytest", "-q", "tests/test_ui.py", "-m", "slow", *session.posargs,
                env={**ENV, "HARNESS_UI_SHOTS": shots, "HARNESS_UI_BROWSER": "required"})
    session.log(f"screenshot: {shots}/runs.png")


@nox.session
def gpu(session: nox.Session) -> None:
    """On a GPU machine: the tests plus the attention benchmark on CUDA."""
    session.install("torch")  # the CUDA build from the index
    session.install("-e", ".[dev]")
    session.run("python", "-c", "import torch; assert torch.cuda.is_available(), 'no GPU'")
    session.run("pytest", "-x", *session.posargs)
    session.run("harness", "bench", "attention", "--device", "cuda")


@nox.session
def fuzz(session: nox.Session) -> None:
    """The property tests of bad input with thousands of examples (a few hundred run in `tests`)."""
    install(session)
    session.run("pytest", "-q", "tests/test_bad_input.py", *session.posargs,
                env={**ENV, "HYPOTHESIS_PROFILE": "fuzz"})
