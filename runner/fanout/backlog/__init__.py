"""The backlog: reading records from files, formats and the input command, and splitting
them into units."""
