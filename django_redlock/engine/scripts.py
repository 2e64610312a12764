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


# Waiters queue up on each master in a sorted set (KEYS[2] below): member = the waiter's id,
# "<inbox>.<n>", where <inbox> names the pub/sub channel its process listens on; score = the server
# time (ms) at which it stops waiting. Earliest deadline first: with equal waits that is first come,
# first served; an entry past its deadline is a waiter that gave up (or died) and is skipped. Queues
# on different masters may disagree on the order now and then: that only means two waiters wake
# instead of one. Safety never depends on them; the quorum SET decides.

# KEYS[1] lock key; KEYS[2] the resource's waiter queue. ARGV[1] our full value (token + owner);
# ARGV[2] the resource's notice channel, or '' to undo a failed attempt quietly (it freed nothing
# another waiter was waiting for); ARGV[3] the notice: a digest of the lease (never the token);
# ARGV[4] the prefix of the processes' inbox channels.
# Deletes the key only if it still holds our value, then wakes the waiter at the head of the queue
# alone: PUBLISH "<digest> <waiter id>" to its process's inbox, so that only that process hears it
# (if no one hears it, that process is gone: the next waiter is tried).
# With no one queued here, PUBLISH "<digest> " on the resource's channel: every waiter may try.
# A waiter hearing one release from every master acts once. Returns 0 if the key was not ours, else
# 1 + the number of subscribers notified (so the releaser learns that someone was woken, and can
# let it go first).
# Also serves the admin's force release, with the exact value shown on its confirmation page.
RELEASE = Script(
    "release",
    """
if redis.call('get', KEYS[1]) ~= ARGV[1] then
    return 0
end
redis.call('del', KEYS[1])
if ARGV[2] == '' then
    return 1
end
local now = redis.call('time')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
while true do
    local head = redis.call('zpopmin', KEYS[2])
    if head[1] == nil then
        break
    end
    if tonumber(head[2]) > now_ms then
        local inbox = ARGV[4] .. string.match(head[1], '^[^.]*')
        local heard = redis.call('publish', inbox, ARGV[3] .. ' ' .. head[1])
        if heard > 0 then
            return 1 + heard
        end
    end
end
return 1 + redis.call('publish', ARGV[2], ARGV[3] .. ' ')
""",
)

# KEYS[1] lock key; KEYS[2] the resource's waiter queue. ARGV[1] our full value; ARGV[2] TTL in
# milliseconds; ARGV[3] the resource's notice channel; ARGV[4] our lease's notice digest; ARGV[5]
# this waiter's id; ARGV[6] how many more milliseconds it will wait.
# SET NX PX as an uncontended acquisition does, for a waiter. If it wins, it leaves the queue, and
# if no one else is queued it tells the waiters on the channel ("+<digest>"): any woken with it by
# a release that found no queue go back to sleep. (Queued waiters are woken one by one and need no
# such notice.) If it loses, it joins the queue, keeping its place if it is already there (ZADD
# NX), and the queue is kept as long as its longest waiter. Returns 1 if set, else 0.
ACQUIRE_WAITING = Script(
    "acquire_waiting",
    """
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    redis.call('zrem', KEYS[2], ARGV[5])
    if redis.call('zcard', KEYS[2]) == 0 then
        redis.call('publish', ARGV[3], '+' .. ARGV[4])
    end
    return 1
end
local now = redis.call('time')
local wait_ms = tonumber(ARGV[6])
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('zadd', KEYS[2], 'NX', now_ms + wait_ms, ARGV[5])
if redis.call('pttl', KEYS[2]) < wait_ms then
    redis.call('pexpire', KEYS[2], wait_ms)
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
