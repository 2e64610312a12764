"""The Redlock algorithm as procedures: generators that yield the I/O they need (a round, a
pause, a notice) and never perform it. Acquire, extend, release, fence (``procedures``,
``holding``), the hand-off, a semaphore's permits. No sockets: ``members`` only through
``members.interface``."""
