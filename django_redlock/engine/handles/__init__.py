"""What a lock handle is made of: its checked fields and options, the lease it records once
granted, and what re-entry's ``at_least``/``at_most`` do to it."""
