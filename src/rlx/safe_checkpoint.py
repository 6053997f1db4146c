"""Loading DeepSpeed's optimizer state without unpickling arbitrary objects.

DeepSpeed saves its state with ``torch.save`` and loads it with ``torch.load(weights_only=False)``,
which can run code hidden in a tampered file. rlx swaps in a checkpoint engine that loads with
``weights_only=True``: tensors and plain data, plus the few DeepSpeed records the state holds.
Policy weights never go through here; they are safetensors.
"""

from __future__ import annotations

import torch
from deepspeed.runtime.checkpoint_engine import TorchCheckpointEngine
from deepspeed.runtime.fp16.loss_scaler import LossScaler
from deepspeed.runtime.zero.config import ZeroStageEnum
from deepspeed.utils.tensor_fragment import fragment_address

STATE_RECORDS = [LossScaler, ZeroStageEnum, fragment_address]  # what ZeRO's optimizer state holds besides tensors


class WeightsOnlyCheckpointEngine(TorchCheckpointEngine):
    """DeepSpeed's torch checkpoint engine, reading with ``weights_only=True``."""

    def load(self, path: str, map_location=None):
        with torch.serialization.safe_globals(STATE_RECORDS):
            return torch.load(path, map_location=map_location, weights_only=True)
