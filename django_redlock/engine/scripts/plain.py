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
    #: It writes what a vote counts on (a grant, an extension, a fence): on a member with
    #: ``wait_replicas``, its vote counts only once that many replicas acknowledged it (``acks``).
    acked: bool = field(default=False, kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())  # noqa: S324 (Redis names scripts by SHA-1)

    def evalsha(self, keys: tuple[str, ...], args: tuple[Any, ...]) -> tuple[Any, ...]:
        return ("EVALSHA", self.sha, len(keys), *keys, *args)


# Waiters queue up on each master in a sorted set (KEYS[2] below): member = the waiter's id,
# "<inbox>.<n>", where <inbox> names the pub/sub channel its process listens on; score = the time
# (ms since the epoch) at which it stops waiting: a one-resource waiter's own clock's, the same on
# every master (see ACQUIRE_WAITING), else the master's. Earliest deadline first: with equal waits
# that is first come, first served; an entry past its deadline (by the master's clock) is a waiter
# that gave up (or died) and is skipped. Queues on different masters may still disagree now and
# then (an entry that reached only some of them): that only means a release is split among two
# waiters. Safety never depends on them; the quorum decides. A waiter for a lock over
# several resources is named "<inbox>.<n>*" (SEVERAL_MARK) in the queue of each of them. A waiter
# for one resource is queued as "<inbox>.<n> <ttl ms> <its value>", so that a release can hand it
# the lock (``wake``): only the id before the first space is ever published (the value holds the
# token), and everything else treats the entry as a whole.

SEVERAL_MARK = "*"

# Shared by the release scripts: wake the waiter at the head of ``queue`` alone: PUBLISH
# "<notice> <waiter id>" to its process's inbox (``inboxes`` .. its inbox id), so that no one else
# hears it; ``notice`` is a digest of the lease released (never the token). If no one hears it,
# that process is gone: the next waiter is tried. A waiter queued with its value (one resource,
# exclusive) is *handed* the lock, ``key``, just freed: SET to its value for its TTL, and told so
# (" +" after its id), so that it holds the lock without a round of its own once a quorum of
# masters told it the same, and no one can take the key in between (see
# ``handoff.handed_over``). Returns the number of subscribers notified.
_WAKE = """
local function wake(queue, notice, inboxes, key)
    local now_ms = nil
    while true do
        local head = redis.call('zpopmin', queue)
        if head[1] == nil then
            return 0
        end
        if now_ms == nil then  -- only when someone is queued: the uncontended release stays cheap
            local now = redis.call('time')
            now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
        end
        if tonumber(head[2]) > now_ms then
            local id, ttl, value = string.match(head[1], '^(%S+) (%d+) (.*)$')
            local told = notice .. ' ' .. (id and id .. ' +' or head[1])
            local heard = redis.call('publish', inboxes .. string.match(head[1], '^[^.]*'), told)
            if heard > 0 then
                if id then
                    redis.call('set', key, value, 'PX', ttl)
                end
                return heard
            end
        end
    end
end
"""

# Shared by RELEASE and a semaphore's PERMIT_RELEASE (``permit_scripts``): KEYS[1] the key;
# KEYS[2] its waiter queue; ARGV[1] our full value; ARGV[5] the id the holder had queued under as a
# waiter, or ''. Leaves the queue first (where the holder's SET lost, it is still queued), then
# deletes the key only if it still holds our value; else the script returns 0 (not ours).
DELETE_OURS = """
if ARGV[5] ~= '' then
    redis.call('zrem', KEYS[2], ARGV[5])
end
if redis.call('get', KEYS[1]) ~= ARGV[1] then
    return 0
end
redis.call('del', KEYS[1])
"""

# KEYS[1] lock key; KEYS[2] the resource's waiter queue. ARGV[1] our full value (token + owner);
# ARGV[2] '1' to wake the next waiter, or '' to undo a failed attempt quietly (it freed nothing
# anyone was waiting for); ARGV[3] the notice: a digest of the lease (never the token); ARGV[4]
# the prefix of the processes' inbox channels; ARGV[5] the id the holder had queued under as a
# waiter, or '': removed first, on every master (where its SET lost, it is still queued).
# Deletes the key only if it still holds our value, then wakes the waiter at the head of the queue.
# Returns 0 if the key was not ours, else 1 + the number of subscribers notified (so the releaser
# learns that it woke someone, and can let it go first). Also serves the admin's force release,
# with the exact value it showed.
RELEASE = Script(
    "release",
    _WAKE
    + DELETE_OURS
    + """if ARGV[2] == '' then
    return 1
end
return 1 + wake(KEYS[2], ARGV[3], ARGV[4], KEYS[1])
""",
)

# A lock over several resources. KEYS[1..n] its lock keys, KEYS[n+1..2n] their waiter queues;
# ARGV as for RELEASE. Deletes each key that still holds our value and wakes the head waiter of
# its queue. Returns how many of the n keys were ours (the master confirms the release iff n).
MULTI_RELEASE = Script(
    "multi_release",
    _WAKE
    + """
local n = #KEYS / 2
local ours = 0
for i = 1, n do
    if ARGV[5] ~= '' then
        redis.call('zrem', KEYS[n + i], ARGV[5])
    end
    if redis.call('get', KEYS[i]) == ARGV[1] then
        redis.call('del', KEYS[i])
        ours = ours + 1
        if ARGV[2] ~= '' then
            wake(KEYS[n + i], ARGV[3], ARGV[4], KEYS[i])
        end
    end
end
return ours
""",
)

# A lock over several resources, all or none on this master. KEYS the lock keys; ARGV[1] our full
# value; ARGV[2] TTL in milliseconds. Sets every key iff none exists. Returns 1 if set, else
# {0, the longest PTTL among the keys that exist} (-1 if one never expires).
MULTI_ACQUIRE = Script(
    "multi_acquire",
    """
local blocked = false
local longest = -1
for _, key in ipairs(KEYS) do
    local ttl = redis.call('pttl', key)
    if ttl ~= -2 then
        blocked = true
        if ttl > longest then
            longest = ttl
        end
    end
end
if blocked then
    return {0, longest}
end
for _, key in ipairs(KEYS) do
    redis.call('set', key, ARGV[1], 'PX', ARGV[2])
end
return 1
""",
    acked=True,
)

# A waiting lock over several resources: MULTI_ACQUIRE, queued like ACQUIRE_WAITING on every
# resource's queue, first come first served with the single waiters. KEYS[1..n] the lock keys,
# KEYS[n+1..2n] their waiter queues. ARGV[1] our full value; ARGV[2] TTL in milliseconds; ARGV[3]
# this waiter's id (ending in SEVERAL_MARK); ARGV[4] how many more milliseconds it will wait;
# ARGV[5] a notice digest and ARGV[6] the inboxes' prefix (as RELEASE's ARGV[3] and ARGV[4]).
# Sets every key iff none exists, and leaves the queues. Else it joins (or keeps its place in)
# every queue and, for each key that is free here, passes the turn on: the first waiter for that
# key alone is woken as a release would, since the release that woke us may have been meant for
# it, and no one else would tell it the key is free. (Not a waiter over several resources: held
# back by another of its keys, it would pass the turn back, and two such would wake each other
# without end.) Nothing is held while waiting, so two such waiters queued in opposite orders
# cannot deadlock. Returns 1 if set, else {0, the longest PTTL among the keys that exist}.
MULTI_ACQUIRE_WAITING = Script(
    "multi_acquire_waiting",
    """
local function pass_on(queue, now_ms)
    -- ZPOPMIN and ZADD only (what an ACL user for the lock path is granted; see RELEASE's wake)
    local lasts = redis.call('pttl', queue)
    local skipped = {}
    for _ = 1, 32 do
        local head = redis.call('zpopmin', queue)
        if head[1] == nil then
            break
        end
        local alive = tonumber(head[2]) > now_ms
        if string.sub(head[1], -1) == '*' then  -- SEVERAL_MARK: it keeps its place
            if alive then
                skipped[#skipped + 1] = head
            end
        elseif alive then
            local inbox = ARGV[6] .. string.match(head[1], '^[^.]*')
            local id = string.match(head[1], '^%S+')  -- never the value (see the queue entries)
            if redis.call('publish', inbox, ARGV[5] .. ' ' .. id) > 0 then
                break
            end
        end
    end
    for _, entry in ipairs(skipped) do
        redis.call('zadd', queue, entry[2], entry[1])
    end
    if #skipped > 0 and lasts > 0 then
        redis.call('pexpire', queue, lasts)  -- emptied and made again: it still expires
    end
end

local n = #KEYS / 2
local free = {}
local longest = -2
for i = 1, n do
    local ttl = redis.call('pttl', KEYS[i])
    if ttl == -2 then
        free[#free + 1] = i
    elseif longest ~= -1 and (ttl == -1 or ttl > longest) then
        longest = ttl  -- -1 (a key that never expires) stays
    end
end
if #free == n then
    for i = 1, n do
        redis.call('set', KEYS[i], ARGV[1], 'PX', ARGV[2])
        redis.call('zrem', KEYS[n + i], ARGV[3])
    end
    return 1
end
local now = redis.call('time')
local wait_ms = tonumber(ARGV[4])
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
for i = 1, n do
    redis.call('zadd', KEYS[n + i], 'NX', now_ms + wait_ms, ARGV[3])
    if redis.call('pttl', KEYS[n + i]) < wait_ms then
        redis.call('pexpire', KEYS[n + i], wait_ms)
    end
end
for _, i in ipairs(free) do
    pass_on(KEYS[n + i], now_ms)
end
return {0, longest}
""",
    acked=True,
)

# Shared by HOLDS and EXTEND: whether every key of KEYS still holds our value ARGV[1].
_ALL_OURS = """
local function all_ours()
    for _, key in ipairs(KEYS) do
        if redis.call('get', key) ~= ARGV[1] then
            return false
        end
    end
    return true
end
"""

# KEYS the lock keys (one or several); ARGV[1] our full value. Returns 1 iff every key still holds
# our value (the lock is still ours on this master), else 0. Changes nothing.
HOLDS = Script("holds", _ALL_OURS + "return all_ours() and 1 or 0\n")

# KEYS[1] lock key; KEYS[2] the resource's waiter queue. ARGV[1] our full value; ARGV[2] TTL in
# milliseconds; ARGV[3] this waiter's queue entry; ARGV[4] how many more milliseconds it will
# wait; ARGV[5] its score: when it stops waiting, in ms of the Unix epoch by its own clock, the
# same number on every master, so that every master's queue has the waiters in the same order
# (scored by each master's clock on arrival, two waiters that came within a few milliseconds
# stood in different orders on different masters, and a release then handed the key to one on
# some masters and to the other on the rest: neither held a quorum).
# SET NX PX as an uncontended acquisition does, for a waiter (subscribed to its inbox first); a
# key that already holds our value was handed to us by a release (``wake``) and is renewed. If
# it wins, it leaves the queue; if it loses, it joins the queue, keeping its place if it is there
# already (ZADD NX), and the queue is kept as long as its longest waiter. Returns 1 if set, else
# {0, the lock key's PTTL}: the waiter sleeps until the holder's lease can have run out.
ACQUIRE_WAITING = Script(
    "acquire_waiting",
    """
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    redis.call('zrem', KEYS[2], ARGV[3])
    return 1
end
if redis.pcall('get', KEYS[1]) == ARGV[1] then  -- a release handed it to us (wake): renewed
    redis.call('pexpire', KEYS[1], ARGV[2])
    redis.call('zrem', KEYS[2], ARGV[3])
    return 1
end
local wait_ms = tonumber(ARGV[4])
redis.call('zadd', KEYS[2], 'NX', ARGV[5], ARGV[3])
if redis.call('pttl', KEYS[2]) < wait_ms then
    redis.call('pexpire', KEYS[2], wait_ms)
end
return {0, redis.call('pttl', KEYS[1])}
""",
    acked=True,
)

# KEYS the lock keys (one or several); ARGV[1] our full value; ARGV[2] new TTL in milliseconds.
# Resets every key's TTL only if each still holds our value: an expired lock is never re-created
# here. Returns 1 if extended, else 0.
EXTEND = Script(
    "extend",
    _ALL_OURS
    + """
if not all_ours() then
    return 0
end
for _, key in ipairs(KEYS) do
    redis.call('pexpire', key, ARGV[2])
end
return 1
""",
    acked=True,
)

# A holder whose body ended before its ``at_least``. KEYS[1..n] the lock keys, KEYS[n+1..2n] their
# waiter queues; ARGV[1] our full value; ARGV[2] milliseconds to keep the lock from now; ARGV[3]
# the value to keep it under (same token, marked finished); ARGV[4] the id the holder had queued
# under as a waiter, or '' (removed first, as RELEASE does). Only if every key still holds our
# value (or already the finished one: a request asked again after a broken connection): rewrites
# each with the finished value and that expiry, and wakes no one (the lock is not free: it lapses
# by itself). Returns 1 if done, else 0.
FINISH = Script(
    "finish",
    """
local n = #KEYS / 2
if ARGV[4] ~= '' then
    for i = 1, n do
        redis.call('zrem', KEYS[n + i], ARGV[4])
    end
end
for i = 1, n do
    local value = redis.call('get', KEYS[i])
    if value ~= ARGV[1] and value ~= ARGV[3] then
        return 0
    end
end
for i = 1, n do
    redis.call('set', KEYS[i], ARGV[3], 'PX', ARGV[2])
end
return 1
""",
    acked=True,
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
    acked=True,
)

# KEYS[1] a lock key; ARGV[1] the most bytes to read of its value. Reads it without trusting it
# (another program's key, megabytes): returns 0 if there is no key; {its length, its first ARGV[1]
# bytes} for a string; {-1, its type} for a key of another type, which blocks SET NX as a lock
# does. Changes nothing.
PEEK = Script(
    "peek",
    """
local kind = redis.call('type', KEYS[1])['ok']
if kind == 'none' then
    return 0
end
if kind ~= 'string' then
    return {-1, kind}
end
return {redis.call('strlen', KEYS[1]), redis.call('getrange', KEYS[1], 0, tonumber(ARGV[1]) - 1)}
""",
)

ALL = (
    RELEASE,
    MULTI_RELEASE,
    ACQUIRE_WAITING,
    MULTI_ACQUIRE,
    MULTI_ACQUIRE_WAITING,
    EXTEND,
    HOLDS,
    FINISH,
    FENCE_RAISE,
    PEEK,
)
