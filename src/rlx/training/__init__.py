"""The policy update: the trainer (DeepSpeed), its micro-batches and losses, LoRA adapters, checked
checkpoints, and the workers that train together."""
