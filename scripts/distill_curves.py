"""README's distillation curves: held-out accuracy per step of the distillation runs beside the demo's GRPO,
drawn from the runs' own records (their curves/eval.csv), after the README's four `rlx fit` commands.

    python scripts/distill_curves.py    # writes notebooks/figures/distill.png and prints the table
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

RUNS = {  # label: the run's work_dir
    "distillation (configs/distill.yaml)": "runs/distill",
    "distillation + GRPO (distill_grpo.yaml)": "runs/distill_grpo",
    "GRPO (distill_baseline.yaml)": "runs/grpo_10",
    "GRPO, the demo (the teacher at step 30)": "runs/demo",
}


def accuracy(work_dir: str) -> pd.Series:
    return pd.read_csv(f"{work_dir}/curves/eval.csv", index_col="step")["eval/accuracy"]


def main() -> None:
    curves = {label: accuracy(folder) for label, folder in RUNS.items()}
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for label, curve in curves.items():
        ax.plot(curve.index, curve.values, marker="o", markersize=3, label=label)
    ax.axhline(curves[list(RUNS)[-1]].iloc[-1] - 0.05, color="grey", linestyle=":", label="teacher's accuracy - 5 pts")
    ax.set(xlabel="RL step", ylabel="held-out accuracy", xlim=(0, 30), title="The demo taught by its step-30 policy")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig("notebooks/figures/distill.png", dpi=110)
    print(pd.DataFrame(curves).T.to_string(float_format="{:.3f}".format))


if __name__ == "__main__":
    main()
