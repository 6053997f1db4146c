"""Several workers: with ``resources.num_workers`` above 1, a group of Ray actors started once for the run,
each a DeepSpeed rank with its own rollout engine (rlx.workers.group); the Ray instance they live in
(rlx.workers.cluster) and what cleans it up after a killed driver (rlx.workers.reaper)."""
