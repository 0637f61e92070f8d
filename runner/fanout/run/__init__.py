"""One run of a job: its wiring (``launch``), rounds of selection and dispatch, the retry
ladder, fan-in between rounds, and what it keeps for the next run."""
