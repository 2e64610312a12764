"""The Lua run on each master, one module per lock family: ``plain`` (a lock, its waiter queue,
its fence; and ``Script``, what every script is), ``permits`` (a semaphore's slots), ``readers``
(a readers/writer lock's readers). Each script says its KEYS, ARGV and returns above it."""
