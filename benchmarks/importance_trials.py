"""How many completed trials Optuna's parameter importance needs before it can be shown.

    python benchmarks/importance_trials.py [--reps 40]

A synthetic tuning study: p searched parameters, uniform on [0, 1], of which only the first
matters (objective = sin(3 x0) + noise; the noise has 1/4 of the signal's standard deviation).
For each number of completed trials n (random sampler), how often does
``optuna.importance.get_param_importances`` (fANOVA, Optuna's default) rank x0 first and give
it at least half of the total importance? The report draws an importance plot only from the n
where that happens in at least 90% of studies (``harness.report.figures.importance_min_trials``);
the table is recorded in ``benchmarks/importance_trials.md``.
"""

from __future__ import annotations

import argparse
import math
import platform
import time

import numpy as np
import optuna


def one(p: int, n: int, seed: int) -> bool:
    rng = np.random.default_rng(seed)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))

    def objective(trial: optuna.Trial) -> float:
        x = [trial.suggest_float(f"x{i}", 0.0, 1.0) for i in range(p)]
        return math.sin(3 * x[0]) + rng.normal(0.0, 0.25 * 0.33)

    study.optimize(objective, n_trials=n)
    imp = optuna.importance.get_param_importances(study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=seed))
    top = max(imp, key=imp.get)
    return top == "x0" and imp["x0"] >= 0.5 * sum(imp.values())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=40)
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    start = time.time()
    sizes = (3, 5, 8, 10, 15, 20, 30)
    print(f"share of {args.reps} studies where fANOVA finds the one parameter that matters")
    print("| searched parameters | " + " | ".join(f"n={n}" for n in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for p in (1, 2, 3, 5):
        cells = [f"{np.mean([one(p, n, s) for s in range(args.reps)]):.2f}" for n in sizes]
        print(f"| {p} | " + " | ".join(cells) + " |", flush=True)
    print(f"\n{platform.platform()}, Python {platform.python_version()}, optuna "
          f"{optuna.__version__}; {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
