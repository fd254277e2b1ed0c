"""nox sessions: tests, slow, lint, typecheck, smoke, ui, fuzz, bench (and gpu where a GPU exists).

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


LINTED = ("harness", "harness_plugins", "tests", "docs/examples", "noxfile.py", "offline")


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
def slow(session: nox.Session) -> None:
    """The long end-to-end selection (``pytest -m slow``) alone, on both cores (``.ci/slow``;
    ``.ci/run`` runs it with the default selection)."""
    install(session)
    session.run("bash", ".ci/slow", *session.posargs, env=ENV, external=True)


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
def bench(session: nox.Session) -> None:
    """The model, attention, mixer and decoding benchmarks at a small size (records in a temporary
    folder). Fails if the harness trains at under 0.95 times the tokens/s of the plain-PyTorch
    reference, or a run's fixed cost exceeds 3 s (5% of a 60-second trial). About 10 minutes on
    one CPU thread. Extra arguments go to the model benchmark (``nox -s bench -- --device cuda``)."""
    install(session)
    out = session.create_tmp()
    small = ("--device", "cpu", "--threads", "1")
    session.run("harness", "bench", "model", "benchmarks/configs/transformer_small.yaml", "--steps", "30",
                "--warmup", "5", "--repeats", "3", "--min-ratio", "0.95", "--max-fixed-cost", "3",
                "--output", f"{out}/model.md", *session.posargs, env=ENV)
    session.run("harness", "bench", "attention", *small, "--lengths", "256", "1024", "--variants",
                "multi_head", "linear", "additive", "--min-time", "0.5", "--output", f"{out}/attention.md",
                env=ENV)
    session.run("harness", "bench", "mixer", *small, "--lengths", "256", "512", "1024", "--contexts", "128",
                "512", "1024", "--fit-from", "256", "--only", "multi_head", "linear", "mamba", "retnet",
                "--min-time", "0.5", "--output", f"{out}/mixers.md", env=ENV)
    session.run("harness", "bench", "decode", *small, "--contexts", "128", "512", "1024", "--fit-from", "128",
                "--only", "multi_head", "linear", "lstm", "gru", "--output", f"{out}/decode.md", env=ENV)


@nox.session
def gpu(session: nox.Session) -> None:
    """On a GPU machine: the GPU tests (``tests/test_gpu.py``: a bf16 run with its cost/MFU, compile;
    ``tests/test_fast_path_gpu.py``: every mixer's FLA fast path against its reference, outputs
    and gradients) and the device-parameter tests; then ``harness bench gpu`` (GPT-2-small-shaped
    Transformer MFU against plain PyTorch, each mixer's reference vs fast path vs FLA's layer at
    L 2048 and 8192, flash attention to 32k, decode latency) and the model, attention, mixer and
    decoding benchmarks on CUDA, each written as a new dated record under ``benchmarks/``
    (``*_cuda_<date>.md``). Installs the pinned torch from PyPI, whose Linux wheel is the CUDA
    build (or from ``$TORCH_INDEX_URL``), and the ``gpu`` extra (fla-core, triton,
    flash-linear-attention). Fails at once where no GPU is visible."""
    install(session, extras="dev,gpu")
    session.run("python", "-c", "import torch; assert torch.cuda.is_available(), 'no CUDA GPU visible'")
    session.run("pytest", "tests/test_gpu.py", "tests/test_fast_path_gpu.py",
                "tests/test_fast_path.py", "tests/test_cost_devices.py", *session.posargs, env=ENV)
    session.run("harness", "bench", "gpu", env=ENV)
    cuda = ("--device", "cuda")
    session.run("harness", "bench", "model", "benchmarks/configs/transformer_small.yaml", *cuda, env=ENV)
    session.run("harness", "bench", "attention", *cuda, "--lengths", "1024", "4096", "16384", env=ENV)
    session.run("harness", "bench", "mixer", *cuda, env=ENV)
    session.run("harness", "bench", "decode", *cuda, env=ENV)


@nox.session
def fuzz(session: nox.Session) -> None:
    """The property tests of bad input with thousands of examples (a few hundred run in `tests`),
    and 200 accepted configurations trained a step each (8 in `tests`); the third probe's
    surfaces too (prepare's sources, exported folders, checkpoint folders, budgets:
    tests/test_faults_properties.py)."""
    install(session)
    session.run("pytest", "-q", "tests/test_bad_input.py", "tests/test_faults_properties.py", *session.posargs,
                env={**ENV, "HYPOTHESIS_PROFILE": "fuzz", "HARNESS_TRAIN_EXAMPLES": "200"})
