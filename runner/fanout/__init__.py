"""fanout: run a backlog of independent units on short-lived sandboxed workers."""

__version__ = "0.1.0"
