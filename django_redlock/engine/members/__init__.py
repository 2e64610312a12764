"""The masters: a member's URL and kind (plain, Sentinel, Cluster), its pipelined connections,
quarantine, replica acknowledgements, and one round of one request per member (``rounds``).
Everything that touches a socket lives here or in ``running``; the algorithm sees the members
only through ``interface``."""
