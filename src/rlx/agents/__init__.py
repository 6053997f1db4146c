"""Multi-turn, tool-using rollouts (``dataflow_config.agent_loop_config``): the tools and environments
the config names (:mod:`rlx.agents.tools`), the model family's call format (:mod:`rlx.agents.format`),
calls under a deadline (:mod:`rlx.agents.calls`) and the turn loop, token in and token out, whose
rollouts carry a mask of the model's own tokens, the only ones training reads (:mod:`rlx.agents.loop`)."""
