/*
 * wakeup.pml -- liveness of the readers/writer waiter queue: is every queued waiter woken?
 * (docs/models.md says what this proves, what it leaves out, and what to change with the Lua.)
 *
 * One master, no faults, no clock: only the wake-ups. Writer 0 holds the lock; reader 1 and
 * writer 2 come in either order and wait (a waiter's deadline never comes). Mirrors the plain
 * lock's ACQUIRE_WAITING (a writer queues with its value) and RELEASE (_WAKE: the head is popped
 * and PUBLISHed to; a writer at the head is handed the key), READER_ACQUIRE (refused while a
 * writer holds the name or a writer is queued; a refused reader queues, keeping its place; a
 * reader that enters wakes the readers queued next) and READER_RELEASE (the last reader out
 * wakes the first queued writer, else the readers at the head), and the waiting client
 * (procedures.acquire / readers.acquire: attempt; lost: sleep until a notice, attempt again).
 *
 * Liveness (LTL, checked with -a and weak fairness): every client is served.
 *
 * A waiter sleeps until a notice (procedures.SAFETY_POLL left out, unless -DSAFETY_POLL: a
 * waiter may also wake by itself, as the 1 s poll does). READER_ACQUIRE passes the wake-up on: a
 * reader refused behind a queued writer while the name is free tells that writer (issue 35 item
 * 7's fix, as MULTI_ACQUIRE_WAITING's pass_on does for a lock's waiters); every client is served
 * without the poll. -DNO_PASS_ON is the script before that fix, and Spin finds issue 35 item 7's
 * run: writer 0 releases and wakes reader 1, the head; the reader is refused (writer 2 is
 * queued), queues again and sleeps; no one wakes writer 2. (A refused reader queues again at the
 * back here; placed by its deadline, as READER_ACQUIRE's ZADD does, the run is the same: it is
 * the writer nobody wakes.)
 */

#define NC 3
#define READER 1

byte key;               /* the name's key: 0 none, client + 1 (a writer), or 9 (readers marker) */
byte readers;           /* readers inside */
byte queue[NC];         /* the waiter queue, in arrival order (scores): client + 1, 0 empty */
bool woken[NC];
byte served;
byte w;

ltl all_served { <> (served == NC) }

inline enqueue(c) {     /* ZADD NX: keeps its place if it is there */
  if
  :: queue[0] == c + 1 || queue[1] == c + 1 || queue[2] == c + 1
  :: else ->
     if
     :: queue[0] == 0 -> queue[0] = c + 1
     :: else -> if :: queue[1] == 0 -> queue[1] = c + 1 :: else -> queue[2] = c + 1 fi
     fi
  fi
}

inline remove(c) {      /* ZREM */
  if
  :: queue[0] == c + 1 -> queue[0] = queue[1]; queue[1] = queue[2]; queue[2] = 0
  :: queue[1] == c + 1 -> queue[1] = queue[2]; queue[2] = 0
  :: queue[2] == c + 1 -> queue[2] = 0
  :: else
  fi
}

/* wake_readers: the readers at the head, up to the first writer */
inline wake_readers() {
  do
  :: queue[0] == READER + 1 -> woken[READER] = 1; remove(READER)
  :: else -> break
  od
}

#define writer_queued(c) ((queue[0] != 0 && queue[0] != READER + 1 && queue[0] != c + 1) || (queue[1] != 0 && queue[1] != READER + 1 && queue[1] != c + 1) || (queue[2] != 0 && queue[2] != READER + 1 && queue[2] != c + 1))

proctype writer(byte c) {
  bool won;
  if
  :: c == 0 -> key = 1; goto holding  /* holds the lock from the start */
  :: else
  fi;
  do
  :: atomic {   /* ACQUIRE_WAITING */
       if
       :: key == 0 || key == c + 1 -> key = c + 1; remove(c); won = 1
       :: else -> enqueue(c)
       fi }
     if
     :: won -> break
     :: else
     fi;
     /* wait_turn: a notice (or, with the poll, by itself) */
#ifdef SAFETY_POLL
     atomic { woken[c] || true -> woken[c] = 0 }
#else
     atomic { woken[c] -> woken[c] = 0 }
#endif
  od;
holding:
  atomic {      /* RELEASE: compare-and-delete, then wake the head (a writer: handed the key) */
    key = 0; served++;
    if
    :: queue[0] != 0 ->
       w = queue[0] - 1; remove(w); woken[w] = 1;
       if :: w != READER -> key = w + 1 :: else fi
    :: else
    fi;
    w = 0 }
}

proctype reader() {
  byte c = READER;
  bool won;
  do
  :: atomic {   /* READER_ACQUIRE */
       if
       :: (key != 0 && key != 9) || writer_queued(c) ->
          enqueue(c);
#ifndef NO_PASS_ON
          /* refused behind a queued writer while the name is free: the turn passes to it */
          if
          :: key == 0 && queue[0] != 0 && queue[0] != READER + 1 -> woken[queue[0] - 1] = 1
          :: key == 0 && queue[0] == READER + 1 && queue[1] != 0 -> woken[queue[1] - 1] = 1
          :: else
          fi
#else
          skip
#endif
       :: else -> readers++; key = 9; remove(c); wake_readers(); won = 1
       fi }
     if
     :: won -> break
     :: else
     fi;
#ifdef SAFETY_POLL
     atomic { woken[c] || true -> woken[c] = 0 }
#else
     atomic { woken[c] -> woken[c] = 0 }
#endif
  od;
  atomic {      /* READER_RELEASE: the last one out wakes the first queued writer */
    readers--; served++;
    if
    :: readers == 0 ->
       key = 0;
       if   /* woken, and left in the queue */
       :: queue[0] != 0 && queue[0] != READER + 1 -> woken[queue[0] - 1] = 1
       :: else ->
          if
          :: queue[1] != 0 && queue[1] != READER + 1 -> woken[queue[1] - 1] = 1
          :: else ->
             if
             :: queue[2] != 0 && queue[2] != READER + 1 -> woken[queue[2] - 1] = 1
             :: else -> wake_readers()
             fi
          fi
       fi
    :: else
    fi }
}

init {
  atomic { run writer(0); run reader(); run writer(2) }
}
