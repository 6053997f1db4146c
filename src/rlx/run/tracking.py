"""Experiment tracking: every step's metrics to the local tracker (jsonl or TensorBoard) and to W&B,
their files under ``log_dir`` (the work_dir unless set).

W&B runs offline unless ``wandb.mode: online`` (which needs ``WANDB_API_KEY`` or a `wandb login`).
The run's W&B id is kept in ``work_dir`` so a resumed run continues the same W&B run.
"""

from __future__ import annotations

import json
import netrc
import os
import secrets
from pathlib import Path

from rlx.config import RLTrainerConfig
from rlx.errors import UserError
from rlx.store.artifacts import write_text
from rlx.store.layout import RunLayout


def numeric(metrics: dict) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def has_wandb_key() -> bool:
    """A key in the environment or from `wandb login` (kept in ~/.netrc)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def read_tracker(path: Path) -> list[dict]:
    """The jsonl tracker's records, one per logged step."""
    if not Path(path).is_file():
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


class Tracker:
    def __init__(self, config: RLTrainerConfig, first_step: int):
        self.layout, self.folder = RunLayout(config.work_dir), config.log_folder
        for folder in (self.layout.work_dir, self.folder):
            folder.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.folder / "tracker.jsonl" if config.exp_tracker == "jsonl" else None
        if self.jsonl:
            self._forget_steps_from(first_step)
        self.tensorboard = self._tensorboard() if config.exp_tracker == "tensorboard" else None
        self.wandb = self._wandb(config) if config.wandb.enabled and config.wandb.mode != "disabled" else None

    def _forget_steps_from(self, first_step: int) -> None:
        """A resumed run logs its unfinished step again: drop what an interrupted run logged of it."""
        self._write_records([record for record in read_tracker(self.jsonl) if record["step"] < first_step])

    def _write_records(self, records: list[dict]) -> None:
        """Rewrite the jsonl whole, atomically: a killed run never leaves half a line behind."""
        write_text("".join(json.dumps(record) + "\n" for record in records), self.jsonl)

    def _tensorboard(self):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UserError(
                "exp_tracker: tensorboard needs the tensorboard package (pip install tensorboard)"
            ) from None
        return SummaryWriter(log_dir=str(self.folder / "tensorboard"))

    def _wandb(self, config: RLTrainerConfig):
        import wandb

        settings = config.wandb
        if settings.mode == "online" and not has_wandb_key():
            raise UserError("wandb.mode is online but no W&B key is set: run `wandb login` or set WANDB_API_KEY")
        id_file = self.layout.work_dir / "wandb_id.txt"
        if not id_file.is_file():
            write_text(secrets.token_hex(4), id_file)
        run_id = id_file.read_text().strip()
        options = {
            "project": settings.project,
            "entity": settings.entity,
            "name": settings.name or Path(config.work_dir).name,
            "group": run_id,
            "mode": settings.mode,
            "dir": str(self.folder.resolve()),  # W&B's service process may have another cwd
            "config": config.model_dump(mode="json"),
        }
        try:
            return wandb.init(id=run_id, resume="allow", **options)
        except Exception:  # noqa: BLE001 - a killed run's W&B process can hold the id for a while
            return wandb.init(id=f"{run_id}-{secrets.token_hex(2)}", **options)

    def log(self, step: int, metrics: dict) -> None:
        values = numeric(metrics)
        if self.jsonl:
            self._write_records([*read_tracker(self.jsonl), {"step": step, **values}])
        if self.tensorboard:
            for name, value in values.items():
                self.tensorboard.add_scalar(name, value, step)
        if self.wandb:
            self.wandb.log(values, step=step)

    def close(self) -> None:
        if self.tensorboard:
            self.tensorboard.close()
        if self.wandb:
            self.wandb.finish()
