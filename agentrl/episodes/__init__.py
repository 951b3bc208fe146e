"""Episodes: the async episode manager, chat rendering as token-exact deltas, template checks; ``source``
(EpisodeSource: what a run asks of whatever plays its episodes, the manager here or Ray's rollout workers)."""
