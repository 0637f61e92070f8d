"""How fast units and requests may go: rate limits, the ceiling learned from throttles,
throttle signals from workers, and the slots."""
