"""Where attempts run: local sandboxes, a pool of SSH hosts, a Ray cluster.  Transports
only move bytes and run steps (``attempt`` decides what an attempt means)."""
