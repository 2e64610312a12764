/*
 * permits.pml -- a semaphore (limit=N): N slot mutexes per master (permit_scripts.py).
 * (docs/models.md says what this proves, what it leaves out, and what to change with the Lua.)
 *
 * Mirrors PERMIT_ACQUIRE (a master takes a free slot for our value: which one depends on the
 * start slot, the queue and the waiters ahead; here any free slot, which covers every start and
 * every queue), the client's count of votes per slot (permits.py: it holds slot s iff a quorum
 * of masters gave it s, within the validity), PERMIT_UNDO (a lost attempt deletes our value
 * from every slot) and PERMIT_RELEASE (compare-and-delete of our slot).
 *
 * Faults: an acquiring request may land late (at most DELAYS in flight at once; its reply may
 * then come after the round gave up on it) or never (a late release or undo is the lock's
 * compare-and-delete, checked in handoff.pml); a client may pause anywhere (the clock ticks),
 * also holding a permit past its lease.
 *
 * Safety, asserted at each entry into a critical section: never more than N clients inside with
 * valid leases.
 *
 * Known-bad variant -DNAIVE_COUNTER: one counter per master (a set of holders, admitted while
 * fewer than N are there), a permit iff a quorum admitted us: three clients can each win a
 * different pair of masters with N=2, and all three hold.
 */

#define NM 3            /* masters */
#define NC 3            /* clients */
#define NP 9            /* pipes: NC * NM */
#define N 2             /* limit: slots per master */
#define Q 2
#ifndef TTL
#define TTL 1           /* ticks */
#endif
#ifndef DELAYS
#define DELAYS 1
#endif

#define ACQ 1           /* PERMIT_ACQUIRE */
#define UNDO 2          /* PERMIT_UNDO */
#define REL 3           /* PERMIT_RELEASE of slot 0 (REL + 1: of slot 1) */

/* per master m, slot s: m * N + s */
byte slot[NM * N];      /* its value: 0 free, else client + 1 */
byte kt[NM * N];        /* ticks it lives on */
#ifdef NAIVE_COUNTER
byte hm[NM];            /* the counter: bit c if client c holds one of its N places */
byte ht[NM * NC];       /* ticks client c's place on master m lives on: m * NC + c */
#endif
/* per client */
byte won[NC];           /* the slot it holds + 1 (naive: 1) */
byte rs[NC];            /* ticks left of its round's validity */
bool awaiting[NC];
bool incs[NC];
byte lv[NC];
/* per pipe c * NM + m */
byte pend[NP];
byte rep[NP];           /* 0 none; else the slot given + 1 (naive: 1), or 9: refused */

#define inflight ((pend[0] != 0) + (pend[1] != 0) + (pend[2] != 0) + (pend[3] != 0) + (pend[4] != 0) + (pend[5] != 0) + (pend[6] != 0) + (pend[7] != 0) + (pend[8] != 0))
#define REFUSED 9

#ifndef NAIVE_COUNTER
inline serve(c, m, r) {
  if
  :: r == ACQ ->
     if
     :: slot[m * N] == 0 -> slot[m * N] = c + 1; kt[m * N] = TTL; out = 1
     :: slot[m * N + 1] == 0 -> slot[m * N + 1] = c + 1; kt[m * N + 1] = TTL; out = 2
     :: else -> out = REFUSED
     fi
  :: r == UNDO ->
     if :: slot[m * N] == c + 1 -> slot[m * N] = 0; kt[m * N] = 0 :: else fi;
     if :: slot[m * N + 1] == c + 1 -> slot[m * N + 1] = 0; kt[m * N + 1] = 0 :: else fi;
     out = 1
  :: r >= REL ->
     if :: slot[m * N + r - REL] == c + 1 -> slot[m * N + r - REL] = 0; kt[m * N + r - REL] = 0
        :: else fi;
     out = 1
  fi
}
#else
#define count(m) (((hm[m] >> 0) & 1) + ((hm[m] >> 1) & 1) + ((hm[m] >> 2) & 1))
inline serve(c, m, r) {
  if
  :: r == ACQ ->
     if
     :: count(m) < N -> hm[m] = hm[m] | (1 << c); ht[m * NC + c] = TTL; out = 1
     :: else -> out = REFUSED
     fi
  :: else -> hm[m] = hm[m] & ~(1 << c); ht[m * NC + c] = 0; out = 1
  fi
}
#endif

inline send(r) {
  pend[c * NM] == 0 && pend[c * NM + 1] == 0 && pend[c * NM + 2] == 0 ->
  awaiting[c] = (r == ACQ);
  m = 0;
  do
  :: m < NM ->
     if
     :: serve(c, m, r);
        if :: awaiting[c] -> rep[c * NM + m] = out :: else fi
     :: r == ACQ && inflight < DELAYS -> pend[c * NM + m] = r
     fi;
     m++
  :: else -> break
  od;
  m = 0; out = 0
}

proctype pipe(byte c; byte m) {
  byte out;
end:
  do
  :: atomic { pend[c * NM + m] != 0 -> serve(c, m, pend[c * NM + m]); pend[c * NM + m] = 0;
       if :: awaiting[c] -> rep[c * NM + m] = out :: else fi;
       out = 0 }
  :: atomic { pend[c * NM + m] != 0 -> pend[c * NM + m] = 0 }
  od
}

#define dec(x) if :: x > 0 -> x-- :: else fi

proctype world() {
  byte i;
end:
  do
  :: d_step {
       i = 0;
       do
       :: i < NM * N -> dec(kt[i]); if :: kt[i] == 0 -> slot[i] = 0 :: else fi; i++
       :: else -> break
       od;
#ifdef NAIVE_COUNTER
       i = 0;
       do
       :: i < NM * NC -> dec(ht[i]); if :: ht[i] == 0 -> hm[i / NC] = hm[i / NC] & ~(1 << (i % NC)) :: else fi; i++
       :: else -> break
       od;
#endif
       i = 0;
       do
       :: i < NC -> dec(rs[i]); dec(lv[i]); i++
       :: else -> break
       od;
       i = 0 }
  od
}

#define valid(c) (incs[c] && lv[c] > 0)
#define votes(c, s) ((rep[c * NM] == s) + (rep[c * NM + 1] == s) + (rep[c * NM + 2] == s))

proctype client(byte c) {
  byte m, out;
  atomic { rs[c] = TTL; send(ACQ) }
  atomic {
    if
    :: votes(c, 1) >= Q -> won[c] = 1
    :: votes(c, 2) >= Q -> won[c] = 2
    :: else
    fi;
    awaiting[c] = 0; rep[c * NM] = 0; rep[c * NM + 1] = 0; rep[c * NM + 2] = 0;
    if
    :: won[c] && rs[c] > 0 ->
       incs[c] = 1; lv[c] = rs[c]; rs[c] = 0;
       /* the safety property: at most N inside with valid leases */
       assert(valid(0) + valid(1) + valid(2) <= N)
    :: else -> won[c] = 0; rs[c] = 0; send(UNDO); goto done
    fi
  }
  /* the critical section (a pause here may outlast the lease) */
  atomic { incs[c] = 0; lv[c] = 0; send(REL + won[c] - 1); won[c] = 0 }
done:
  skip
}

init {
  atomic {
    run world();
    run pipe(0, 0); run pipe(0, 1); run pipe(0, 2);
    run pipe(1, 0); run pipe(1, 1); run pipe(1, 2);
    run pipe(2, 0); run pipe(2, 1); run pipe(2, 2);
    run client(0); run client(1); run client(2)
  }
}
