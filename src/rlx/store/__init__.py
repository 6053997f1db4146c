"""A run's files: where each lives (layout), written atomically (artifacts), hashed (integrity), never
over what rlx did not write (targets), and the named points a test kills a run at (faults)."""
