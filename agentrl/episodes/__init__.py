"""Episodes: the async episode manager, chat rendering as token-exact deltas, template checks."""
