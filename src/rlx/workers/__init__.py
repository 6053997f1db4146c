"""Work in Ray actors: with ``resources.num_workers`` above 1 (or a ``ray_address``), a group of workers
started once for the run, each a DeepSpeed rank with its own rollout engine (rlx.workers.group,
rlx.workers.worker); with ``resources.num_rollout_workers``, rollout workers apart from them, given
the policy's weights each step (rlx.workers.group.RolloutPool); with ``cpu_resources``, judge actors
(rlx.workers.judges); what all kinds share (rlx.workers.actors); the Ray instance they live in
(rlx.workers.cluster) and what cleans it up after a killed driver (rlx.workers.reaper)."""
