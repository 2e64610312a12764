"""The handles a user holds, one module per kind of lock: ``lock`` (a plain lock), ``permit``
(a semaphore's permit), ``readers`` (a reader), ``group`` (what the last two share), and
``modes`` (which one a ``lock()`` call makes)."""
