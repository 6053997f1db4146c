"""The algorithm library: pure tensor functions (no I/O, no engine state), callable from notebooks.

- :mod:`rlx.algo.advantages` — rewards to advantages (GRPO family)
- :mod:`rlx.algo.losses` — policy-gradient surrogates and loss aggregation
- :mod:`rlx.algo.kl` — KL estimators against a reference policy
"""
