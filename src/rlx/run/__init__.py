"""The run: `rlx fit`'s loop over steps (rlx.run.fit), the rollouts it makes ahead under
``max_staleness`` (rlx.run.ahead), its record and resume, the checks and lock before it starts, and its
tracker."""
