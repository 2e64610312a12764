"""The only code that blocks or awaits: the drivers that run a procedure's steps, with threads
or on an event loop, and the watchdog thread that renews auto-extended leases."""
