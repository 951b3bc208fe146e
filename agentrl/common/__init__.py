"""Small pieces every layer uses: documented config fields, bounded text parsing, fault points,
the server-process reaper, the API-model client and the cache directory. Nothing here imports another agentrl
package."""
