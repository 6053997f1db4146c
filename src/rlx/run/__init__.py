"""The run: `rlx fit`'s loop over steps, the checks and lock before it starts, its tracker, and the
process each training worker runs."""
