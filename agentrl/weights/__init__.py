"""Moving the trainer's new weights into the rollout engine: in-process, disk, tensor, distributed,
and drained updates (every turn sampled by one policy version)."""
