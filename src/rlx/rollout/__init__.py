"""Rollout engines behind one call. ``transformers`` runs anywhere; ``lmdeploy`` needs the ``gpu`` extra.

Every backend returns :class:`rlx.rollout.types.Generation` objects: token ids in, token ids,
text, per-token log-probs and a finish reason out.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlx.config import RolloutConfig, SampleParams
from rlx.errors import UserError
from rlx.rollout.types import Generation


def generate(
    config: RolloutConfig, model, tokenizer, prompt_ids: Sequence[Sequence[int]], params: SampleParams, *, seed: int
) -> list[Generation]:
    if config.backend != "transformers":
        raise UserError(
            f"rollout_config.backend {config.backend!r} is not available in this build of rlx; use 'transformers'"
        )
    from rlx.rollout.transformers_backend import generate as generate_with_transformers

    return generate_with_transformers(
        model, tokenizer, prompt_ids, params, seed=seed, batch_size=config.rollout_max_batch_size
    )
