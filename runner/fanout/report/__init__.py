"""What a run comes to, for people: the report, the fleet and usage tables, compute, status
and the aggregate command."""
