"""The scheduler behind ``fanout schedule``."""
