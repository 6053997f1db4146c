"""The algorithm library: pure tensor functions (no I/O, no engine state), callable from notebooks.

- :mod:`rlx.algo.advantages` — rewards to advantages (GRPO family)
- :mod:`rlx.algo.losses` — policy-gradient surrogates and loss aggregation
- :mod:`rlx.algo.kl` — KL estimators against a reference policy
- :mod:`rlx.algo.registry` — the name table of each kind: where a name is spelled, once

Importing this package or its registry loads no torch (the config imports the registry); the
algorithm modules, and torch with them, load at the registry's first lookup.
"""
