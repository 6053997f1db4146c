"""Prompt datasets: the synthetic demo task and converters for public sets, all in one row shape."""
