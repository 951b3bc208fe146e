"""Small pieces every layer uses: documented config fields, bounded text parsing, fault points,
the server-process reaper and the API-model client. Nothing here imports another agentrl package."""
