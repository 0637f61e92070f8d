"""One attempt of one unit: decided once on the coordinator (``model``), carried out by
one driver (``driver``) over any transport's sandbox (``seam``, ``sandbox``), and read
into a result (``verdict``)."""
