"""The scripts of a readers/writer lock's readers (see ``readers``). The writer is the plain lock
on the same name and runs the plain lock's scripts.

Keys per name, on each master: the plain lock key (a writer's value, or the marker ``readers``
while readers hold it, with a TTL at least as long as every reader's); one key per reader (its own
token and TTL: an ordinary lease); ``readers:<name>``, a sorted set of the readers' keys by expiry
(server ms), so that the last reader out can tell; the name's waiter queue (writers and readers
alike, as for a lock), and ``readwait:<name>``, the set of queued waiters that are readers, so
that a queued writer (a live queue entry not in it) stops new readers.
"""

from __future__ import annotations

from . import plain as plain_scripts

_NOW = """
local now = redis.call('time')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
"""

# Tell the waiter queued as ``entry`` that its turn may have come: PUBLISH "<notice> <its id>" to
# its process's inbox (never its value, which follows the id in a writer's entry). ARGV[5] notice
# digest, ARGV[6] inbox prefix (as in scripts.plain._WAKE).
_TELL = """
local function tell(entry)
    local inbox = ARGV[6] .. string.match(entry, '^[^.]*')
    return redis.call('publish', inbox, ARGV[5] .. ' ' .. string.match(entry, '^%S+'))
end
"""

# Wake the readers at the head of the queue (KEYS[3]), up to the first writer; skip entries past
# their deadline.
_WAKE_READERS = """
local function wake_readers(queue, reading)
    while true do
        local head = redis.call('zrange', queue, 0, 0, 'WITHSCORES')
        if head[1] == nil then
            return
        end
        if tonumber(head[2]) > now_ms and redis.call('sismember', reading, head[1]) == 0 then
            return
        end
        redis.call('zrem', queue, head[1])
        redis.call('srem', reading, head[1])
        if tonumber(head[2]) > now_ms then
            tell(head[1])
        end
    end
end
"""

# KEYS[1] this reader's key; KEYS[2] the plain lock key; KEYS[3] the waiter queue; KEYS[4] the
# readers set; KEYS[5] the set of queued readers. ARGV[1] our full value; ARGV[2] TTL in ms;
# ARGV[3] this waiter's id or ''; ARGV[4] how many more ms it waits; ARGV[5] notice digest;
# ARGV[6] inbox prefix. A semaphore's marker there: {-1, it}. A writer there, or a live queued
# writer (a queue entry not among the queued readers): refused, and a waiter queues (as a reader)
# {0, the plain key's PTTL (-1 for a queued writer)}. Refused by a queued writer while the name is
# free here (no writer, no reader), it tells that writer, as a release would have: the release
# that woke this reader (the head of the queue, ahead of the writer) woke no one else, and the
# writer, which readers step aside for, would sleep until its safety poll while the name stays
# free. Else: set our key, enter the readers set, raise the marker's TTL to at least ours, leave
# the queue, wake the readers queued next (they may share), and return 1.
READER_ACQUIRE = plain_scripts.Script(
    "reader_acquire",
    _NOW
    + _TELL
    + _WAKE_READERS
    + """
local mark = redis.call('get', KEYS[2])
if mark and (string.match(mark, '^semaphore:%d+$') or string.match(mark, '^permits:%d+$')) then
    return {-1, mark}
end
local refused = nil
if mark and mark ~= 'readers' then
    refused = redis.call('pttl', KEYS[2])
else
    for _, w in ipairs(redis.call('zrangebyscore', KEYS[3], now_ms + 1, '+inf')) do
        if w ~= ARGV[3] and redis.call('sismember', KEYS[5], w) == 0 then
            refused = -1
            if not mark then
                tell(w)  -- pass the wake-up on (left queued: readers keep out until it wins)
            end
            break
        end
    end
end
if refused ~= nil then
    if ARGV[3] ~= '' then
        local wait_ms = tonumber(ARGV[4])
        redis.call('zadd', KEYS[3], 'NX', now_ms + wait_ms, ARGV[3])
        redis.call('sadd', KEYS[5], ARGV[3])
        for _, key in ipairs({KEYS[3], KEYS[5]}) do
            if redis.call('pttl', key) < wait_ms then
                redis.call('pexpire', key, wait_ms)
            end
        end
    end
    return {0, refused}
end
local ttl = tonumber(ARGV[2])
redis.call('set', KEYS[1], ARGV[1], 'PX', ttl)
redis.call('zadd', KEYS[4], now_ms + ttl, KEYS[1])
if redis.call('pttl', KEYS[4]) < ttl then
    redis.call('pexpire', KEYS[4], ttl)
end
if redis.call('pttl', KEYS[2]) < ttl then
    redis.call('set', KEYS[2], 'readers', 'PX', ttl)
end
if ARGV[3] ~= '' then
    redis.call('zrem', KEYS[3], ARGV[3])
    redis.call('srem', KEYS[5], ARGV[3])
end
wake_readers(KEYS[3], KEYS[5])
return 1
""",
    acked=True,
)

# KEYS[1] this reader's key; KEYS[2] the plain lock key; KEYS[3] the readers set. ARGV[1] our full
# value; ARGV[2] new TTL in ms. Renews our key if it still holds our value and the plain lock key
# holds the marker or nothing (written again then; never over a writer), with the marker's TTL at
# least ours. Returns 1 if renewed, else 0.
READER_EXTEND = plain_scripts.Script(
    "reader_extend",
    _NOW
    + """
if redis.call('get', KEYS[1]) ~= ARGV[1] then
    return 0
end
local mark = redis.call('get', KEYS[2])
if mark and mark ~= 'readers' then
    return 0
end
local ttl = tonumber(ARGV[2])
redis.call('pexpire', KEYS[1], ttl)
redis.call('zadd', KEYS[3], now_ms + ttl, KEYS[1])
if redis.call('pttl', KEYS[3]) < ttl then
    redis.call('pexpire', KEYS[3], ttl)
end
if redis.call('pttl', KEYS[2]) < ttl then
    redis.call('set', KEYS[2], 'readers', 'PX', ttl)
end
return 1
""",
    acked=True,
)

# KEYS[1] this reader's key; KEYS[2] the plain lock key; KEYS[3] the waiter queue; KEYS[4] the
# readers set; KEYS[5] the queued readers. ARGV[1] our full value; ARGV[2] '1' to wake waiters,
# '' to undo quietly; ARGV[3] the id we had queued under, or ''; ARGV[4] unused; ARGV[5] notice
# digest; ARGV[6] inbox prefix. Deletes our key if it holds our value; the last live reader out
# also deletes the marker and wakes the first live writer in the queue (readers queued ahead of
# it could not enter while it waits: waking one of them would leave the writer asleep), leaving it
# queued so that readers keep out until it wins on every master; or, with no writer waiting, the
# readers at its head. Returns 0 if the key was not ours, else 1.
READER_RELEASE = plain_scripts.Script(
    "reader_release",
    _NOW
    + _TELL
    + _WAKE_READERS
    + """
if ARGV[3] ~= '' then
    redis.call('zrem', KEYS[3], ARGV[3])
    redis.call('srem', KEYS[5], ARGV[3])
end
if redis.call('get', KEYS[1]) ~= ARGV[1] then
    return 0
end
redis.call('del', KEYS[1])
redis.call('zrem', KEYS[4], KEYS[1])
redis.call('zremrangebyscore', KEYS[4], '-inf', now_ms)
if redis.call('zcard', KEYS[4]) > 0 then
    return 1
end
if redis.call('get', KEYS[2]) == 'readers' then
    redis.call('del', KEYS[2])
end
if ARGV[2] == '' then
    return 1
end
for _, w in ipairs(redis.call('zrangebyscore', KEYS[3], now_ms + 1, '+inf')) do
    if redis.call('sismember', KEYS[5], w) == 0 then
        -- Woken, and left in the queue: until it wins, new readers still step aside for it.
        tell(w)
        return 1
    end
end
wake_readers(KEYS[3], KEYS[5])
return 1
""",
)
