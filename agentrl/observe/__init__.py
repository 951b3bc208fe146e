"""What a run shows and keeps: metrics, health monitors, sinks, the live progress bar, curves, the
HTML report and the rollout log."""
