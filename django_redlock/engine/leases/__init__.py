"""What an acquisition holds (``Lease``), who holds it through a shared handle (``callers``),
re-entry by the same owner, and the callbacks told off the renewal path."""
