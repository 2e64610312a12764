"""A seeded, randomized, history-checked fuzzer of the lock over real masters.

``python -m bench.fuzz --seconds 60 --seed 7 --faults all`` runs client processes that draw their
operations from the seed (``client``) while a controller makes faults (``run``), then judges what
they recorded (``history``). Exit 0 when the history has no violation.
"""
