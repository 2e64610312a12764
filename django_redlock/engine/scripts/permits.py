"""The scripts of a semaphore's permits (see ``permits``): acquire a slot, renew it with the
name's marker; and the names they use (slot keys, the marker, the limit's bounds)."""

from __future__ import annotations

from . import plain as plain_scripts

#: Most permits a semaphore may have: each is a key on every master, and a contended attempt
#: reads the slots of one master in one script.
MAX_LIMIT = 10_000


#: The kind of key a permit's slot is, after the key prefix (as ``lock`` is a lock's).
SLOT_KIND = "slot"


def slot_prefix(key_prefix: str, name: str) -> str:
    """The keys of the semaphore ``name``'s permits: slot ``i``'s is this followed by ``i`` (the
    scripts build them so, from this prefix). A key space of their own, apart from every lock's
    ``lock:<name>``: under ``lock:<name>#<i>``, a plain lock named ``ticket#2`` was slot 2 of
    ``ticket`` (holding it took a permit away, silently), and permits held made that lock "held
    by another owner". The one place slot keys are made."""
    return f"{key_prefix}{SLOT_KIND}:{name}#"


def slot_of(slot_key: str) -> int:
    return int(slot_key.rpartition("#")[2])


def check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be an int from 1 to {MAX_LIMIT}, got {limit!r}")
    return limit


# The semaphore's waiter queue is first come, first served: a sorted set of waiter entries,
# "<waiter id> <deadline>", scored by when the waiter asked, both in the client's wall-clock
# milliseconds. By when it asked, not by its deadline: a caller that asked with a long wait would
# otherwise be overtaken by every later one with a shorter wait. In the client's clock, so that
# every master holds the same order (a score from each master's own clock orders two waiters by
# when their requests happened to reach it, which differs between masters, and a semaphore's
# admission follows that order: masters in different orders would admit different waiters, and
# none would win a quorum). An entry whose deadline is past is a waiter that gave up or died, and
# is dropped when met. Ties go by entry: the same on every master. An entry of another form (a
# plain lock's waiter on the same name, queued as ``scripts`` says) is alive until its score.
#
# Admission: a caller may take a free slot only if fewer live waiters are ahead of it than slots
# are free (a caller not queued has every live waiter ahead). Without this, a slot freed by a
# release goes to whichever caller asks next (a releaser coming back, a new arrival) rather than
# to the waiter the release woke, which is still on its way. Reading the waiters ahead pops them
# and puts them back (ZPOPMIN and ZADD: what the ACL user of the lock path is granted), at most as
# many as slots are free.
_AHEAD = """
local function alive(entry, score, now_ms)
    return tonumber(string.match(entry, '^%S+ (%d+)$') or score) > now_ms
end

local function ahead_of(queue, me, now_ms, most)
    local ahead = {}
    local popped = {}
    local lasts = redis.call('pttl', queue)
    while #ahead < most do
        local head = redis.call('zpopmin', queue)
        if head[1] == nil then
            break
        end
        if head[1] == me then
            popped[#popped + 1] = head
            break
        end
        if alive(head[1], head[2], now_ms) then  -- else: gave up or died, dropped
            popped[#popped + 1] = head
            ahead[#ahead + 1] = head[1]
        end
    end
    for _, entry in ipairs(popped) do
        redis.call('zadd', queue, entry[2], entry[1])
    end
    if #popped > 0 and lasts > 0 then
        redis.call('pexpire', queue, lasts)  -- emptied and made again: it still expires
    end
    return ahead
end

-- Wakes the first ``most`` live waiters that hear it, leaving them queued; one that no one
-- hears (its process is gone, or not subscribed on this master yet) leaves the queue, and the
-- next is woken in its place, so that a free slot always reaches a waiter that is listening.
local function wake_first(queue, most, now_ms, notice, inboxes)
    local woken = {}
    local lasts = redis.call('pttl', queue)
    while #woken < most do
        local head = redis.call('zpopmin', queue)
        if head[1] == nil then
            break
        end
        if alive(head[1], head[2], now_ms) then
            local inbox = inboxes .. string.match(head[1], '^[^.]*')
            local id = string.match(head[1], '^%S+')  -- the id alone (see scripts' queues)
            if redis.call('publish', inbox, notice .. ' ' .. id) > 0 then
                woken[#woken + 1] = head
            end
        end
    end
    for _, entry in ipairs(woken) do
        redis.call('zadd', queue, entry[2], entry[1])
    end
    if #woken > 0 and lasts > 0 then
        redis.call('pexpire', queue, lasts)
    end
    return #woken
end

local function queue_up(queue, me, score, now_ms)
    redis.call('zadd', queue, 'NX', score, me)
    local wait_ms = tonumber(string.match(me, '^%S+ (%d+)$') or score) - now_ms
    if wait_ms > 0 and redis.call('pttl', queue) < wait_ms then
        redis.call('pexpire', queue, wait_ms)
    end
end
"""

# KEYS[1] the name's plain lock key (the marker); KEYS[2] the semaphore's waiter queue. ARGV[1]
# our full value; ARGV[2] TTL in ms; ARGV[3] the marker ("semaphore:<N>"); ARGV[4] this waiter's
# entry ("<id> <deadline>"), or '' for no waiter; ARGV[5] its score (when it asked); ARGV[6] the
# slots' key prefix; ARGV[7] N; ARGV[8] the slot to start from; ARGV[9] the client's time (ms);
# ARGV[10] a notice digest and ARGV[11] the inboxes' prefix (as RELEASE's ARGV[3] and ARGV[4]).
# If the marker key holds anything else: returns {-1, what it is} ("lock" for a plain
# lock's value: never a token). Else, with k live waiters ahead of it (see above), it takes the
# k+1-th free slot from ARGV[8] on (in slot order, wrapping), raises the marker's TTL to at least
# ours, takes the waiter out of the queue, and returns the slot + 1. Every master given the same
# start, the same free slots and the same queue takes the same one; the client counts the votes
# per slot. Else a waiter joins the queue (keeping its place if it is there), the waiters ahead
# are woken if a slot is free (the release that woke them may have been missed, or a slot expired)
# and it returns {0, the soonest PTTL of a slot (-1 if none expires)}. The slot keys are built
# from ARGV[6] (``slot_prefix``), on a standalone master (no cluster slots to respect).
PERMIT_ACQUIRE = plain_scripts.Script(
    "permit_acquire",
    _AHEAD
    + """
local mark = redis.call('get', KEYS[1])
if mark and mark ~= ARGV[3] then
    -- another limit, an earlier version's semaphore (permits:<N>: see ``markers``), readers
    if string.match(mark, '^semaphore:%d+$') or string.match(mark, '^permits:%d+$')
            or mark == 'readers' then
        return {-1, mark}
    end
    return {-1, 'lock'}
end
local n = tonumber(ARGV[7])
local start = tonumber(ARGV[8])
local now_ms = tonumber(ARGV[9])
local soonest = -1
local function take(slot, set)
    if not set then
        redis.call('set', ARGV[6] .. slot, ARGV[1], 'PX', ARGV[2])
    end
    if redis.call('pttl', KEYS[1]) < tonumber(ARGV[2]) then
        redis.call('set', KEYS[1], ARGV[3], 'PX', ARGV[2])
    end
    if ARGV[4] ~= '' then
        redis.call('zrem', KEYS[2], ARGV[4])
    end
    return slot + 1
end
local free = {}
local queued = redis.call('zcard', KEYS[2]) > 0
for i = 0, n - 1 do
    local slot = (start + i) % n
    local key = ARGV[6] .. slot
    if not queued and redis.call('set', key, ARGV[1], 'NX', 'PX', ARGV[2]) then
        return take(slot, true)  -- no one waits: the first free slot, as a lock's SET NX
    end
    local ttl = redis.call('pttl', key)
    if ttl == -2 then
        free[#free + 1] = slot
    elseif ttl >= 0 and (soonest < 0 or ttl < soonest) then
        soonest = ttl
    end
end
local ahead = {}
if #free > 0 then
    ahead = ahead_of(KEYS[2], ARGV[4], now_ms, #free)
    if #ahead < #free then
        return take(free[#ahead + 1], false)
    end
    wake_first(KEYS[2], #free, now_ms, ARGV[10], ARGV[11])
end
if ARGV[4] ~= '' then
    queue_up(KEYS[2], ARGV[4], ARGV[5], now_ms)
end
return {0, soonest}
""",
    acked=True,
)

# KEYS[1] the slot's lock key; KEYS[2] the semaphore's waiter queue. ARGV[1] our full value;
# ARGV[2] '1' to wake waiters, or ''; ARGV[3] the notice (a digest of the lease); ARGV[4] the
# inboxes' prefix; ARGV[5] the entry the holder had queued under, or '' (removed first); ARGV[6] a
# waiter entry to put back in the queue (an attempt undoing a slot it took but did not win: it
# keeps its place), or '', with ARGV[7] its score; ARGV[8] the client's time (ms); ARGV[9] the
# slots' key prefix and ARGV[10] N (0 if unknown: then only the first waiter is woken).
# Compare-and-delete; then wakes as many live waiters, first first, as slots are free, leaving
# them in the queue (a woken waiter keeps its place until it has a permit, so no one asking
# meanwhile takes the slot meant for it). Returns 0 if the slot was not ours, else 1 + the
# number of waiters woken.
PERMIT_RELEASE = plain_scripts.Script(
    "permit_release",
    _AHEAD
    + plain_scripts.DELETE_OURS
    + """local now_ms = tonumber(ARGV[8])
if ARGV[6] ~= '' then
    queue_up(KEYS[2], ARGV[6], ARGV[7], now_ms)
end
if ARGV[2] == '' or redis.call('zcard', KEYS[2]) == 0 then
    return 1
end
local free = 1
local n = tonumber(ARGV[10])
if n > 0 then
    free = 0
    for slot = 0, n - 1 do
        if redis.call('pttl', ARGV[9] .. slot) == -2 then
            free = free + 1
        end
    end
end
return 1 + wake_first(KEYS[2], free, now_ms, ARGV[3], ARGV[4])
""",
)

# ARGV[1] our full value; ARGV[2] the slots' key prefix; ARGV[3] N. Deletes our value from every
# slot that holds it (an interrupted acquisition does not know which slot a master gave it).
# Returns how many it deleted.
PERMIT_UNDO = plain_scripts.Script(
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
PERMIT_EXTEND = plain_scripts.Script(
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
    acked=True,
)
