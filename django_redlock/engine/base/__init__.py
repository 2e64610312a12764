"""The bottom layer: what every other layer stands on, with no engine import of its own: the
typed errors, the events a lock tells, the Redlock decisions as pure functions (``protocol``), the
value stored on the masters, per-loop deadlines, beacons, and the process id."""
