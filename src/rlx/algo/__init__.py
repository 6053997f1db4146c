"""The algorithm library: pure tensor functions (no I/O, no engine state), callable from notebooks.

- :mod:`rlx.algo.advantages` — rewards to advantages (GRPO family)
- :mod:`rlx.algo.losses` — policy-gradient surrogates and loss aggregation
- :mod:`rlx.algo.kl` — KL estimators against a reference policy
- :mod:`rlx.algo.registry` — the name table of each kind: where a name is spelled, once

This package imports nothing heavy, so the config can read the registry's names without torch
until it validates.
"""
