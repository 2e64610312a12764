"""The scripts of a semaphore's permits (see ``permits``): acquire a slot, renew it with the
name's marker; and the names they use (slot keys, the marker, the limit's bounds)."""

from __future__ import annotations

from . import scripts

#: Most permits a semaphore may have: each is a key on every master, and a contended attempt
#: reads the slots of one master in one script.
MAX_LIMIT = 10_000


def slot_of(slot_key: str) -> int:
    return int(slot_key.rpartition("#")[2])


def check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be an int from 1 to {MAX_LIMIT}, got {limit!r}")
    return limit


# KEYS[1] the name's plain lock key (the marker); KEYS[2] the semaphore's waiter queue. ARGV[1]
# our full value; ARGV[2] TTL in ms; ARGV[3] the marker ("permits:<N>"); ARGV[4] this waiter's
# id, or '' for no waiter; ARGV[5] how many more ms it waits; ARGV[6] the slots' key prefix
# ("...lock:<name>#"); ARGV[7] N; ARGV[8] the slot to start from. If the marker key holds
# anything else: returns {-1, what it is} ("lock" for a plain lock's value: never a token). Else
# takes the first free slot from ARGV[8] on (SET NX PX, in slot order, wrapping), raises the
# marker's TTL to at least ours, takes the waiter out of the queue, and returns the slot + 1.
# Every master given the same start and the same free slots takes the same one; the client counts
# the votes per slot. If none is free: a waiter joins the queue (as in ACQUIRE_WAITING); returns
# {0, the soonest PTTL of a slot (-1 if none expires)}. The slot keys are built from ARGV[6]:
# all of them under the name, on a standalone master (no cluster slots to respect).
PERMIT_ACQUIRE = scripts.Script(
    "permit_acquire",
    """
local mark = redis.call('get', KEYS[1])
if mark and mark ~= ARGV[3] then
    if string.match(mark, '^permits:%d+$') or mark == 'readers' then
        return {-1, mark}
    end
    return {-1, 'lock'}
end
local n = tonumber(ARGV[7])
local start = tonumber(ARGV[8])
local soonest = -1
for i = 0, n - 1 do
    local slot = (start + i) % n
    local key = ARGV[6] .. slot
    if redis.call('set', key, ARGV[1], 'NX', 'PX', ARGV[2]) then
        if redis.call('pttl', KEYS[1]) < tonumber(ARGV[2]) then
            redis.call('set', KEYS[1], ARGV[3], 'PX', ARGV[2])
        end
        if ARGV[4] ~= '' then
            redis.call('zrem', KEYS[2], ARGV[4])
        end
        return slot + 1
    end
    local ttl = redis.call('pttl', key)
    if ttl >= 0 and (soonest < 0 or ttl < soonest) then
        soonest = ttl
    end
end
if ARGV[4] ~= '' then
    local now = redis.call('time')
    local wait_ms = tonumber(ARGV[5])
    local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
    redis.call('zadd', KEYS[2], 'NX', now_ms + wait_ms, ARGV[4])
    if redis.call('pttl', KEYS[2]) < wait_ms then
        redis.call('pexpire', KEYS[2], wait_ms)
    end
end
return {0, soonest}
""",
)

# ARGV[1] our full value; ARGV[2] the slots' key prefix; ARGV[3] N. Deletes our value from every
# slot that holds it (an interrupted acquisition does not know which slot a master gave it).
# Returns how many it deleted.
PERMIT_UNDO = scripts.Script(
    "permit_undo",
    """
local gone = 0
for slot = 0, tonumber(ARGV[3]) - 1 do
    local key = ARGV[2] .. slot
    if redis.call('get', key) == ARGV[1] then
        redis.call('del', key)
        gone = gone + 1
    end
end
return gone
""",
)

# KEYS[1] the slot's lock key; KEYS[2] the marker key. ARGV[1] our full value; ARGV[2] new TTL
# in ms; ARGV[3] the marker. Renews the slot only if it still holds our value and the marker key
# holds the marker or nothing (then it is written again: never over another mode's key), and
# raises the marker's TTL to at least the slot's. Returns 1 if renewed, else 0.
PERMIT_EXTEND = scripts.Script(
    "permit_extend",
    """
if redis.call('get', KEYS[1]) ~= ARGV[1] then
    return 0
end
local mark = redis.call('get', KEYS[2])
if mark and mark ~= ARGV[3] then
    return 0
end
redis.call('pexpire', KEYS[1], ARGV[2])
if redis.call('pttl', KEYS[2]) < tonumber(ARGV[2]) then
    redis.call('set', KEYS[2], ARGV[3], 'PX', ARGV[2])
end
return 1
""",
)
