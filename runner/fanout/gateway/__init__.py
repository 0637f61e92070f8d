"""The API gateway in the coordinator."""
