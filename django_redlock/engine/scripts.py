"""The Lua scripts run on each master. Compare-and-act happens only here, atomically, with the key
in KEYS and our token in ARGV, so that no client can ever delete or extend another owner's lock.

Scripts are sent by SHA (EVALSHA) and resent in full on NOSCRIPT, so a ``SCRIPT FLUSH`` or a
restarted master costs one extra request, never an error.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())  # noqa: S324 (Redis names scripts by SHA-1)

    def evalsha(self, keys: tuple[str, ...], args: tuple[Any, ...]) -> tuple[Any, ...]:
        return ("EVALSHA", self.sha, len(keys), *keys, *args)


# KEYS[1] lock key; ARGV[1] our full value (token + owner); ARGV[2] the resource's notice channel,
# or '' to undo a failed attempt quietly (it freed nothing another waiter was waiting for).
# Deletes the key only if it still holds our value, then tells waiters (PUBLISH) that it is free;
# the message names the lease released (a digest, never the token) so that a waiter hearing the
# same release from every master wakes once.
# Returns 0 if the key was not ours, else 1 + the number of subscribers notified (so the releaser
# learns that others wait, and can let them go first).
# Also serves the admin's force release, with the exact value shown on its confirmation page.
RELEASE = Script(
    "release",
    """
if redis.call('get', KEYS[1]) == ARGV[1] then
    redis.call('del', KEYS[1])
    if ARGV[2] == '' then
        return 1
    end
    return 1 + redis.call('publish', ARGV[2], string.sub(redis.sha1hex(ARGV[1]), 1, 16))
end
return 0
""",
)

# KEYS[1] lock key; ARGV[1] our full value; ARGV[2] TTL in milliseconds; ARGV[3] the resource's
# notice channel. SET NX PX as an uncontended acquisition does, for a waiter: if it wins, it tells
# the other waiters at once ("+" and a digest of the new lease), so that they go back to sleep
# instead of all trying after every release. Returns 1 if set, else 0.
ACQUIRE_WAITING = Script(
    "acquire_waiting",
    """
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    redis.call('publish', ARGV[3], '+' .. string.sub(redis.sha1hex(ARGV[1]), 1, 16))
    return 1
end
return 0
""",
)

# KEYS[1] lock key; ARGV[1] our full value; ARGV[2] new TTL in milliseconds.
# Resets the TTL only if the key still holds our value: an expired lock is never re-created here.
# Returns 1 if extended, else 0.
EXTEND = Script(
    "extend",
    """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
""",
)

# KEYS[1] fence counter key; ARGV[1] a token just chosen from a quorum's counters.
# Raises the counter to ARGV[1] unless it is already higher (a max-register: never goes down).
# Returns the counter's value afterwards.
FENCE_RAISE = Script(
    "fence_raise",
    """
local current = tonumber(redis.call('get', KEYS[1]) or '0')
local proposed = tonumber(ARGV[1])
if proposed > current then
    redis.call('set', KEYS[1], ARGV[1])
    return proposed
end
return current
""",
)

ALL = (RELEASE, ACQUIRE_WAITING, EXTEND, FENCE_RAISE)
