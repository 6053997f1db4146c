"""Loading runs for exploration: the library behind the notebooks, `rlx show` and `rlx compare`.

Everything is read from the run's own artifacts (no W&B account needed) as pandas DataFrames:

    run = Run("runs/demo")
    run.history()              # one row per step: rewards, losses, eval accuracy, timings
    run.samples(3)             # step 3's responses joined with their judgments and the update's advantages
    run.policy(12)             # a HF folder with step 12's policy (its checkpoint, or re-created by replay)
    run.eval_samples(30)       # the held-out answers of an evaluated step
    run.follow(prompt_index)   # one training prompt's responses at every step it was drawn
    run.turns(3, group, sample)  # an agent's rollout part by part: model turns, tool results (untrained)
    run.tokens(3, group, sample)  # the same token by token: text, trained or masked, log-prob
    compare(Run("a"), Run("b"))  # the params that differ, and the final metrics side by side
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import yaml

from rlx.config import rollout_policy_step, staleness
from rlx.debugging import quiet_libraries
from rlx.errors import UserError, first_line
from rlx.judgers.rows import VERDICT
from rlx.store.artifacts import read_json
from rlx.store.integrity import file_hash, first_changed
from rlx.store.layout import RunLayout, read_record
from rlx.store.targets import FOLDER_MARK
from rlx.tokens import decode_many

log = logging.getLogger(__name__)
MATERIALIZE = "rlx materialize"
# a distilled step's scored tokens (Run.disagreements, Run.teacher_tokens)
TAUGHT_COLUMNS = ["group", "sample", "position", "text", "student", "teacher", "gap", "teacher_name"]


def flatten(tree: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists stay values)."""
    flat = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{path}."))
        else:
            flat[path] = value
    return flat


@dataclass(frozen=True)
class Run:
    work_dir: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "work_dir", Path(self.work_dir))
        if not (self.work_dir / "step-0").is_dir():
            raise UserError(f"{self.work_dir}: not an rlx run (no step-0 folder); pass the run's work_dir")

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.work_dir)

    @property
    def name(self) -> str:
        return self.work_dir.name

    def steps(self) -> list[int]:
        """Completed steps, in order."""
        return self.layout.completed_steps()

    def config(self) -> dict:
        """The resolved configuration the run was started with."""
        if not self.layout.config.is_file():
            raise UserError(f"{self.work_dir}: no config.yaml (written by `rlx fit`)")
        damaged = f"{self.layout.config}: unreadable ({{}}); it was damaged after rlx wrote it"
        try:
            config = yaml.safe_load(self.layout.config.read_text())
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise UserError(damaged.format(first_line(exc))) from None
        if not isinstance(config, dict):
            raise UserError(damaged.format("not a mapping"))
        return config

    def unproven_rollouts(self) -> list[str]:
        """Each step whose rollouts the engine sampled with other weights than the policy the run records for
        them (the engine's digest, recorded by the rollout stage, against the policy's fingerprint)."""
        lag, problems = self.config().get("dataflow_config", {}).get("max_staleness", 0), []
        for step in self.steps():
            held = read_record(self.layout.step(step).metrics("rollout")).get("rollout/engine_digest")
            policy = rollout_policy_step(step, lag)
            recorded = read_json(self.layout.step(policy).weights_fingerprint)["digest"]
            if held and held != recorded:
                problems.append(
                    f"step {step}: its rollouts were sampled with weights {held[:12]}, not the policy of step {policy} "
                    f"the run records ({recorded[:12]})"
                )
        return problems

    def history(self) -> pd.DataFrame:
        """One row per completed step (step 0: the base policy's evaluation), every logged metric a column."""
        rows = [{"step": 0, **self.layout.step(0).metrics_checked("base")}]
        rows += [{"step": step, **self.layout.step_metrics(step)} for step in self.steps()]
        return pd.DataFrame(rows).set_index("step")

    def _step_dir(self, step: int):
        paths = self.layout.step(step)
        if not paths.rollouts.is_file():
            base = " (step 0 is the base model, before any rollout)" if step == 0 else ""
            raise UserError(f"{self.work_dir}: step {step} has no rollouts{base}; completed steps: {self.steps()}")
        return paths

    def samples(self, step: int) -> pd.DataFrame:
        """A step's responses with their judgments and what the update made of them (``update.parquet``:
        the reward it used, KL, advantage, importance weights; empty until the step has trained)."""
        paths = self._step_dir(step)
        table = partial(checked_table, paths)
        rollouts = table(paths.rollouts).drop(columns=[VERDICT], errors="ignore")  # judged has it
        judged = table(paths.judged).drop(columns=["step", "group", "sample"])
        update = table(paths.update) if paths.update.is_file() else pd.DataFrame(index=judged.index)
        taught = checked_table(paths, paths.teacher)[["teacher", "reverse_kl"]] if self.distilled(step) else None
        prompts = table(paths.prompts)[["group", "dataset", "index"]]
        parts = [rollouts.reset_index(drop=True), judged.reset_index(drop=True), update, taught]
        frame = pd.concat([part for part in parts if part is not None], axis=1)
        frame = frame.merge(prompts, on="group", how="left")
        frame["question"] = frame["prompt"].map(lambda p: json.loads(p)[-1]["content"])
        group_rewards = frame.groupby("group")["reward"]
        frame["zero_std_group"] = group_rewards.transform("std").fillna(0).eq(0)
        return frame.drop(
            columns=["prompt_ids", "response_ids", "rollout_logprobs", "prompt", "response_mask"], errors="ignore"
        )

    def turns(self, step: int, group: int, sample: int) -> pd.DataFrame:
        """An agent's rollout (``dataflow_config.agent_loop_config``) part by part, as its tokens were
        made: the model's turns and the tool results between them (``trained`` False: the loss skipped
        them), each with its text, token count and, for tool results, the turn's calls."""
        row, tokenizer = self._agent_rollout(step, group, sample), self.tokenizer()
        calls = json.loads(row["tool_calls"])
        parts, model_turns = [], 0
        for trained, ids in segments(list(row["response_ids"]), list(row["response_mask"])):
            model_turns += trained
            made = [call for call in calls if call["turn"] == model_turns] if not trained else []
            parts.append({"who": "model" if trained else "tool", "trained": bool(trained), "tokens": len(ids),
                          "text": tokenizer.decode(ids), "calls": made})  # fmt: skip
        return pd.DataFrame(parts)

    def tokens(self, step: int, group: int, sample: int) -> pd.DataFrame:
        """An agent's rollout token by token: each response token's id, its text, whether the loss reads
        it (``trained``: the model's own; False for the tools' tokens, masked) and its sampled log-prob
        (none for a masked token: the model did not sample it)."""
        row, tokenizer = self._agent_rollout(step, group, sample), self.tokenizer()
        ids = list(row["response_ids"])
        return pd.DataFrame(
            {
                "id": ids,
                "text": [tokenizer.decode([token]) for token in ids],
                "trained": [bool(m) for m in row["response_mask"]],
                "logprob": list(row["rollout_logprobs"]),
            }
        )

    def teacher_tokens(self, step: int, group: int, sample: int) -> pd.DataFrame:
        """A distilled response token by token (``teacher_config``): its text, the student's sampled log-prob,
        the teacher's, and ``gap`` (student less teacher: positive where the student is surer than its teacher,
        the tokens the distillation pushes down)."""
        picked = self._taught_tokens(step, lambda rollout: (rollout.group, rollout.sample) == (group, sample))
        if picked.empty:
            raise UserError(f"{self.work_dir}: step {step} has no taught response of group {group}, sample {sample}")
        return picked

    def disagreements(self, step: int, top: int | None = 20) -> pd.DataFrame:
        """The step's response tokens where the student disagrees most with its teacher (largest ``gap``,
        log p_student - log p_teacher, in either direction), one row per token: ``top`` of them (None: all)."""
        frame = self._taught_tokens(step, lambda rollout: True)
        ranked = frame.reindex(frame["gap"].abs().sort_values(ascending=False).index).reset_index(drop=True)
        return ranked if top is None else ranked.head(top)

    def _taught_tokens(self, step: int, wanted) -> pd.DataFrame:
        """Each token a teacher scored in the step's responses that are ``wanted``, in order: its text, the
        student's and the teacher's log-probs and their gap."""
        paths = self._step_dir(step)
        if not self.distilled(step):
            raise UserError(f"{self.work_dir}: step {step} was not distilled (no teacher_config in its run)")
        rollouts, teachers = checked_table(paths, paths.rollouts), checked_table(paths, paths.teacher)
        tokenizer, rows = self.tokenizer(), []
        for rollout, taught in zip(rollouts.itertuples(), teachers.itertuples(), strict=True):
            if taught.teacher is None or not wanted(rollout):
                continue
            texts = decode_many(tokenizer, [[token] for token in rollout.response_ids], skip_special_tokens=False)
            scored = zip(texts, rollout.rollout_logprobs, taught.teacher_logprobs, strict=True)
            rows += [
                (rollout.group, rollout.sample, position, text, student, teacher, student - teacher, taught.teacher)
                for position, (text, student, teacher) in enumerate(scored)
                if teacher is not None
            ]
        return pd.DataFrame(rows, columns=TAUGHT_COLUMNS)

    def distilled(self, step: int) -> bool:
        """Whether the step was distilled: its teacher stage wrote rows (none without teacher_config)."""
        paths = self.layout.step(step)
        return paths.teacher.is_file() and pq.read_metadata(paths.teacher).num_rows > 0

    def _agent_rollout(self, step: int, group: int, sample: int) -> pd.Series:
        paths = self._step_dir(step)
        rows = checked_table(paths, paths.rollouts)
        row = rows[(rows["group"] == group) & (rows["sample"] == sample)]
        if row.empty or "response_mask" not in row:
            raise UserError(f"{self.work_dir}: step {step} has no agent rollout of group {group}, sample {sample}")
        return row.iloc[0]

    def tokenizer(self):
        """The run's tokenizer (``tokenizer_path``, checked against ``load_from``'s model), from wherever this runs."""
        quiet_libraries()  # a notebook's cell shows the tokens, not the libraries' warnings as they load
        from rlx.training.loading import load_tokenizer

        params = self.config()
        return load_tokenizer(self.project_path(params["tokenizer_path"]), self.project_path(params["load_from"]))

    def project_path(self, path: str) -> Path:
        """A path of the run's config as `rlx fit` read it: a relative one starts at the project (the
        folder the configured ``work_dir`` is relative to), not at this process's working directory."""
        named = Path(self.config()["work_dir"])
        if Path(path).is_absolute() or named.is_absolute():  # (an absolute work_dir: the project is unknown)
            return Path(path)
        return self.work_dir.resolve().parents[len(named.parts) - 1] / path

    def policy(self, step: int, out: Path | None = None) -> Path:
        """A HF folder with step ``step``'s policy: its checkpoint if it has one (and no ``out`` is asked
        for), else re-created by replay into ``out`` (default ``<work_dir>/materialized/step-N``, reused
        while its files are what was written for the step's recorded fingerprint)."""
        from rlx.training.lora import is_adapter

        paths = self.layout.step(step)
        if not paths.weights_fingerprint.is_file():
            raise UserError(f"{self.work_dir}: step {step} has no policy (trained steps: {self.steps()})")
        folder = Path(out or self.work_dir / "materialized" / f"step-{step}")
        if out is None and folder.exists():
            if (problem := unlike_what_was_written(folder, paths)) is None:
                return folder
            log.warning("%s; writing it again", problem)
        with self.trainers(replaying=step not in self.layout.checkpoints()) as engines:
            if out is None and step in self.layout.checkpoints() and not is_adapter(paths.policy):
                engines.policy(step)  # its weights checked against the step's fingerprint
                return paths.policy  # (a LoRA checkpoint holds an adapter: it is merged into ``folder``)
            mark = {"made_by": MATERIALIZE, "step": step, "fingerprint": file_hash(paths.weights_fingerprint)}
            return engines.home.write_policy(step, folder, mark)

    def trainers(self, replaying: bool):
        """The run's trainers, to read or re-create a policy, without its judge actors or rollout workers: in
        this process, or to replay updates, a group of as many workers as the run trained on (summed over
        that many ranks, its updates replay bitwise only there)."""
        from rlx.training.restore import config_to_read
        from rlx.workers.cluster import unanswered
        from rlx.workers.group import warm_engines

        config = config_to_read(self.work_dir, replaying)
        if (address := config.resources.ray_address) and (problem := unanswered(address)):
            log.warning(
                "the run's Ray cluster %s is gone (%s): its workers are started on this machine", address, problem
            )
            config = config_to_read(self.work_dir, replaying, ("resources.ray_address=null",))
        return warm_engines(config)

    def eval_samples(self, step: int) -> pd.DataFrame:
        paths = self.layout.step(step)
        if not paths.eval_samples.is_file():
            raise UserError(f"{self.work_dir}: step {step} has no evaluation")
        return checked_table(paths, paths.eval_samples)

    def eval_steps(self) -> list[int]:
        return [step for step in [0, *self.steps()] if len(self.eval_samples(step))]

    def follow(self, index: int, dataset: str | None = None) -> pd.DataFrame:
        """One training prompt (by its dataset index) at every step it was drawn: its answers change."""
        frames = []
        for step in self.steps():
            frame = self.samples(step)
            chosen = frame[(frame["index"] == index) & ((frame["dataset"] == dataset) if dataset else True)]
            frames.append(chosen)
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def eval_changes(self, before: int, after: int) -> pd.DataFrame:
        """Held-out problems side by side at two evaluated steps: which improved, which regressed."""
        first = self.eval_samples(before).groupby(["dataset", "index"])["correct"].mean()
        second = self.eval_samples(after).groupby(["dataset", "index"])["correct"].mean()
        table = pd.DataFrame({f"step {before}": first, f"step {after}": second})
        table["change"] = table[f"step {after}"] - table[f"step {before}"]
        return table.sort_values("change")


def segments(ids: list[int], mask: list[int]) -> list[tuple[int, list[int]]]:
    """The response's runs of tokens with one mask value, in order: ``(mask, ids)``."""
    runs: list[tuple[int, list[int]]] = []
    for token, scored in zip(ids, mask, strict=True):
        if runs and runs[-1][0] == scored:
            runs[-1][1].append(token)
        else:
            runs.append((scored, [token]))
    return runs


def checked_table(paths, path: Path) -> pd.DataFrame:
    """A step's table, once it is what its stage wrote (a table edited since is refused, not shown)."""
    return pd.read_parquet(paths.checked(path))


def unlike_what_was_written(folder: Path, paths) -> str | None:
    """Why a folder materialized earlier is not the policy of the step at ``paths`` as rlx wrote it (its
    mark names the step's fingerprint and hashes its files), or None."""
    try:
        mark = read_json(folder / FOLDER_MARK)
        recorded = mark["fingerprint"], mark["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{folder}: not written by {MATERIALIZE} (no readable {FOLDER_MARK})"
    if recorded[0] != file_hash(paths.weights_fingerprint):
        return f"{folder}: materialized from another fingerprint than step {paths.dir.name}'s"
    problem = first_changed(folder, recorded[1])
    return f"{problem}, since it was materialized" if problem else None


def compare(first: Run, second: Run) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(params that differ, last metrics side by side) of two runs."""
    a, b = flatten(first.config()), flatten(second.config())
    differing = {key: (a.get(key), b.get(key)) for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)}
    params = pd.DataFrame(differing, index=[first.name, second.name]).T
    last = pd.DataFrame({first.name: first.history().iloc[-1], second.name: second.history().iloc[-1]})
    keep = [name for name in last.index if not name.startswith("time/")]
    return params, last.loc[keep]


def response_table(records: list[dict], title: str):
    """`rlx show`'s table: the texts share what width is left, cut to one line; a column that would say the
    same for every row (every response stopped, none stale, no agent) is left out."""
    from rich.table import Table

    agent = bool(records) and "tool_calls" in records[0]
    optional = {
        "finish": [r["finish_reason"] for r in records],
        "stale": [str(staleness(r)) for r in records],
        "turns": [str(r["turns"]) for r in records] if agent else [],
        "calls": [calls_shown(json.loads(r["tool_calls"])) for r in records] if agent else [],
    }
    optional = {name: cells for name, cells in optional.items() if set(cells) - {"stop", "0"}}
    table = Table(title=title, title_justify="left", pad_edge=False, box=None, header_style="bold", expand=True)
    table.add_column("#", no_wrap=True)
    for name, ratio in (("question", 2), ("response", 3)):
        table.add_column(name, ratio=ratio, no_wrap=True, overflow="ellipsis", min_width=8)
    for name in ("answer/gold", "reward", "adv", *optional):
        table.add_column(name, no_wrap=True, justify="right")
    for index, row in enumerate(records):
        answer = f"{row['extracted']}/{row['ground_truth']}" if "ground_truth" in row else str(row["extracted"])
        table.add_row(
            f"{row['group']}.{row['sample']}", " ".join(row["question"].split()),
            " ".join(row["response_text"].split()), answer, f"{row['reward']:.2f}", f"{row['advantage']:+.2f}",
            *(cells[index] for cells in optional.values()),
        )  # fmt: skip
    return table


def calls_shown(calls: list[dict]) -> str:
    """An agent rollout's calls as `rlx show` counts them: how many, and how many failed (shown as errors)."""
    failed = sum(call["error"] is not None for call in calls)
    return f"{len(calls)} ({failed} failed)" if failed else str(len(calls))
