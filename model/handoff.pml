/*
 * handoff.pml -- a lock's acquire and release with the FIFO hand-off and its notices.
 * (docs/models.md says what this proves, what it leaves out, and what to change with the Lua.)
 *
 * Mirrors django_redlock/engine/scripts/plain.py: ACQUIRE_WAITING (SET NX; else renew a key that a
 * release handed us; else ZADD NX into the queue), RELEASE (DELETE_OURS: ZREM the holder's own
 * queue entry, compare-and-delete; then _WAKE: ZPOPMIN the head, skip dead entries, PUBLISH to
 * its inbox and, if heard, SET the key to the waiter's value for its TTL); and the client in
 * procedures.attempt/acquire (a quorum within the validity, the undo of a lost attempt, which
 * clears Waiter.trusts_hand_offs), handoff.handed_over (a quorum of masters' " +" words is the
 * lock, valid from Waiter.queued_since, refused with less than TTL/2 left) and
 * notice_reading.deliver / waiter.votes_left (the word of an abstaining member does not count).
 *
 * Faults: a request may land late (at most DELAYS in flight at once; then its reply may come
 * after its round gave up on it: a lost reply) or never, a notice may be lost, a client may pause anywhere (the clock ticks
 * meanwhile), also in its critical section past its lease; with -DRESTART master 0 restarts
 * empty once (keys and queue gone, requests in flight to it lost) and abstains MAX_TTL after.
 *
 * Time: timers count down on each tick of one abstract clock (a tick is any span of time). A
 * key set with TTL lives TTL ticks; a lease won by a round lives TTL ticks from the tick the
 * round began (the engine's drift allowance is what makes real clocks honour that).
 *
 * Safety, asserted at each entry into a critical section (the only step that can begin an
 * overlap): no two clients inside with valid leases.
 *
 * Known-bad variants: -DRELEASE_NO_COMPARE (the release deletes whatever the key holds),
 * -DQUORUM_ONE, -DRESTART -DNO_QUARANTINE (a restarted member votes at once). The quarantine
 * model is this one with -DRESTART (and -DTRIES=1, to bound the state space).
 * -DVALID_FROM_WORD: a waiter counts its lease from when it read the hand-off words, not from
 * its first queued attempt (the key was SET by the release before, and lapses sooner).
 * -DTRUST_AFTER_UNDO (a waiter keeps trusting hand-off words after it undid an attempt) and
 * -DVALID_FROM_WORD are refuted only with -DTHIRD, a third client that does not wait (after a
 * hand-off, someone must compete): searches too long for the suite (docs/models.md).
 */

#define NM 3            /* masters */
#ifdef THIRD
#define NC 3            /* clients: two waiters and (2) a plain competitor, SET NX, no queue */
#define NP 9
#else
#define NC 2            /* clients */
#define NP 6            /* pipes and notice slots: NC * NM */
#endif
#ifdef QUORUM_ONE
#define Q 1
#else
#define Q 2             /* NM / 2 + 1 */
#endif
#define TTL 2           /* every lease's TTL, in ticks: MAX_TTL */
#ifndef WAIT
#define WAIT 2          /* how long an acquisition waits, in ticks */
#endif
#ifndef DELAYS
#define DELAYS 1        /* requests in flight late at once, at most */
#endif
#ifndef TRIES
#define TRIES 2         /* attempts per acquisition */
#endif

/* requests */
#define ACQ 1           /* ACQUIRE_WAITING */
#define UNDO 2          /* RELEASE with notify '' and queued_as '' (undo of a lost attempt) */
#define REL 3           /* RELEASE with notify '1' and queued_as our entry */
#define PLAIN 4         /* SET NX PX (an acquisition that does not wait) */
/* replies */
#define GR 1            /* granted (SET, renewed, or deleted ours) */
#define DN 2            /* denied (held by another value; not ours) */
#define AB 3            /* granted by an abstaining member: a failed vote */

/* per master */
byte val[NM];           /* the key: 0 none, else client + 1 */
byte kt[NM];            /* ... ticks it lives on */
byte qmask[NM];         /* its queue: bit c if client c is queued (its score: sc[c]) */
byte qt[NM];            /* it abstains this many ticks more (quarantine) */
bool restarted;
/* per client */
byte sc[NC];            /* ticks its wait lasts: its queue score, the same on every master */
bool listening[NC];     /* its inbox is subscribed: a PUBLISH to it is heard */
byte rs[NC];            /* ticks left of the validity of its current round */
byte qs[NC];            /* ticks left of TTL from its first queued attempt (queued_since) */
byte handed[NC];        /* masters whose word that they handed it the lock counted */
bool awaiting[NC];      /* it awaits its round's replies */
bool incs[NC];          /* it is in its critical section ... */
byte lv[NC];            /* ... valid this many ticks more */
/* per pipe between client c and master m, c * NM + m */
byte pend[NP];          /* a request in flight */
byte rep[NP];           /* its reply, read */
/* per notice from master m to client c, m * NC + c, not read yet: 1 handed it the key */
bool note[NP];

#ifdef THIRD
#define inflight ((pend[0] != 0) + (pend[1] != 0) + (pend[2] != 0) + (pend[3] != 0) + (pend[4] != 0) + (pend[5] != 0) + (pend[6] != 0) + (pend[7] != 0) + (pend[8] != 0))
#else
#define inflight ((pend[0] != 0) + (pend[1] != 0) + (pend[2] != 0) + (pend[3] != 0) + (pend[4] != 0) + (pend[5] != 0))
#endif

/* RELEASE's wake(): pop the head (earliest deadline, ties by id) until one is alive and its
 * inbox hears the PUBLISH; that one is handed the key for its TTL and told so. */
inline wake(m) {
  do
  :: qmask[m] == 0 -> break
  :: else ->
     if
     :: (qmask[m] & 1) && (!(qmask[m] & 2) || sc[0] <= sc[1]) -> w = 0
     :: else -> w = 1
     fi;
     qmask[m] = qmask[m] & ~(1 << w);
     if
     :: sc[w] > 0 && listening[w] ->
        val[m] = w + 1; kt[m] = TTL;
        if
        :: qt[m] == 0 -> note[m * NC + w] = 1
        :: true       /* the notice is lost; or the member abstains: its word does not count
                       * (notice_reading.deliver, waiter.votes_left) */
        fi;
        break
     :: else
     fi
  od;
  w = 0
}

/* request r of client c, run on master m: one Lua script, atomic */
inline serve(c, m, r) {
  if
  :: r == PLAIN ->
     if
     :: val[m] == 0 -> val[m] = c + 1; kt[m] = TTL; out = GR
     :: else -> out = DN
     fi
  :: r == ACQ ->
     if
     :: val[m] == 0 || val[m] == c + 1 ->    /* SET NX; or a key handed to us: renewed */
        val[m] = c + 1; kt[m] = TTL; qmask[m] = qmask[m] & ~(1 << c); out = GR
     :: else -> qmask[m] = qmask[m] | (1 << c); out = DN
     fi
  :: else ->
     if
     :: r == REL -> qmask[m] = qmask[m] & ~(1 << c)
     :: else
     fi;
#ifdef RELEASE_NO_COMPARE
     if
     :: val[m] != 0 ->
#else
     if
     :: val[m] == c + 1 ->
#endif
        val[m] = 0; kt[m] = 0; out = GR;
        if
        :: r == REL -> wake(m)
        :: else
        fi
     :: else -> out = DN
     fi
  fi;
  if
  :: out == GR && qt[m] > 0 -> out = AB
  :: else
  fi
}

/* a round: request r to every master. Each lands now (its reply read if the round awaits
 * replies), or later (its pipe delivers it or loses it). A pipe still carrying an earlier
 * request delivers that one first (TCP order): the round waits for it. */
inline send(r) {
  pend[c * NM] == 0 && pend[c * NM + 1] == 0 && pend[c * NM + 2] == 0 ->
  awaiting[c] = (r == ACQ || r == PLAIN);
  m = 0;
  do
  :: m < NM ->
     if
     :: serve(c, m, r);
        if
        :: awaiting[c] -> rep[c * NM + m] = out
        :: else
        fi
     :: inflight < DELAYS -> pend[c * NM + m] = r
     fi;
     m++
  :: else -> break
  od;
  m = 0; out = 0
}

/* the connection between client c and master m: lands its request in flight, or loses it */
proctype pipe(byte c; byte m) {
  byte out, w;
end:
  do
  :: atomic { pend[c * NM + m] != 0 -> serve(c, m, pend[c * NM + m]); pend[c * NM + m] = 0;
       if
       :: awaiting[c] -> rep[c * NM + m] = out
       :: else        /* its round is over: read and dropped */
       fi;
       out = 0 }
  :: atomic { pend[c * NM + m] != 0 -> pend[c * NM + m] = 0 }   /* never lands */
  od
}

#define dec(x) if :: x > 0 -> x-- :: else fi

proctype world() {
  byte i;
end:
  do
  :: d_step {   /* a tick */
       i = 0;
       do
       :: i < NM -> dec(kt[i]); if :: kt[i] == 0 -> val[i] = 0 :: else fi; dec(qt[i]); i++
       :: else -> break
       od;
       i = 0;
       do
       :: i < NC -> dec(sc[i]); dec(rs[i]); dec(qs[i]); dec(lv[i]); i++
       :: else -> break
       od;
       i = 0 }
#ifdef RESTART
  :: atomic { !restarted ->   /* master 0 restarts empty; its connections break */
       restarted = 1; val[0] = 0; kt[0] = 0; qmask[0] = 0;
       pend[0] = 0; pend[NM] = 0;
#ifndef NO_QUARANTINE
       qt[0] = TTL
#endif
     }
#endif
  od
}

#define gr(c, m) (rep[c * NM + m] == GR)
#define failed(c, m) (rep[c * NM + m] == 0 || rep[c * NM + m] == AB)

/* master m's word that it handed client c the key, if it counts now (votes_left) */
#define hv(c, m) (((handed[c] >> m) & 1) * (qt[m] == 0))

#define valid(c) (incs[c] && lv[c] > 0)

inline enter(c) {
  incs[c] = 1;
  /* the safety property: no one else inside with a valid lease while ours is valid */
#ifdef THIRD
  assert(valid(0) + valid(1) + valid(2) <= 1)
#else
  assert(!(incs[1 - c] && lv[1 - c] > 0 && lv[c] > 0))
#endif
}

proctype client(byte c) {
  byte m, out, w, grants, tries;
  bool trust;
  atomic { listening[c] = 1; trust = 1; sc[c] = WAIT }
  do
  :: /* an attempt (procedures.attempt with a waiter): step 1 and 2 */
     atomic {
       rs[c] = TTL;
       if
       :: tries == 0 -> qs[c] = TTL   /* queued_since */
       :: else
       fi;
       send(ACQ)
     }
     /* the round returns once a quorum granted, or when its budget ran out: at any time (a
      * reply that comes later is read and dropped). Step 3; step 4, the undo of a lost one. */
     atomic {
       grants = gr(c, 0) + gr(c, 1) + gr(c, 2);
       tries++;
       if
       :: grants >= Q && rs[c] > 0 ->
          lv[c] = rs[c]; enter(c);
          awaiting[c] = 0; rep[c * NM] = 0; rep[c * NM + 1] = 0; rep[c * NM + 2] = 0;
          break
       :: else
       fi;
       if
       :: grants > 0 || failed(c, 0) || failed(c, 1) || failed(c, 2) ->
          awaiting[c] = 0; rep[c * NM] = 0; rep[c * NM + 1] = 0; rep[c * NM + 2] = 0;
#ifndef TRUST_AFTER_UNDO
          trust = 0;
#endif
          send(UNDO)
       :: else -> awaiting[c] = 0; rep[c * NM] = 0; rep[c * NM + 1] = 0; rep[c * NM + 2] = 0
       fi;
       rs[c] = 0; grants = 0
     }
     /* wait_turn: woken by a notice, or the holder's PTTL ran out, or the safety poll: at any
      * time; it reads the notices that came (notice_reading.deliver). Then handed_over: a
      * quorum's word is the lock, valid from queued_since, if TTL/2 of it is left. */
     atomic {
       m = 0;
       do
       :: m < NM ->
          if
          :: note[m * NC + c] && qt[m] == 0 -> handed[c] = handed[c] | (1 << m)
          :: else
          fi;
          note[m * NC + c] = 0; m++
       :: else -> m = 0; break
       od;
       if
       :: trust && hv(c, 0) + hv(c, 1) + hv(c, 2) >= Q && 2 * qs[c] >= TTL && qs[c] > 0 ->
#ifndef VALID_FROM_WORD
          lv[c] = qs[c]; enter(c); break
#else
          lv[c] = TTL; enter(c); break
#endif
       :: else
       fi;
       if
       :: sc[c] > 0 && tries < TRIES    /* attempt again */
       :: else -> goto gone             /* out of time: leave the queues */
       fi
     }
  od;
  /* the critical section; the clock may pass our validity here (a pause) */
  atomic { incs[c] = 0; lv[c] = 0;
gone:
    send(REL);
    listening[c] = 0; handed[c] = 0; qs[c] = 0; sc[c] = 0; tries = 0; trust = 0 }
}

#ifdef THIRD
/* a client that does not wait: SET NX once or twice, undoes a lost attempt, releases */
proctype competitor(byte c) {
  byte m, out, w, tries;
  do
  :: tries < 2 ->
     atomic { rs[c] = TTL; send(PLAIN) }
     atomic {
       tries++;
       if
       :: gr(c, 0) + gr(c, 1) + gr(c, 2) >= Q && rs[c] > 0 ->
          awaiting[c] = 0; rep[c * NM] = 0; rep[c * NM + 1] = 0; rep[c * NM + 2] = 0;
          lv[c] = rs[c]; rs[c] = 0; enter(c); break
       :: else ->
          awaiting[c] = 0; rep[c * NM] = 0; rep[c * NM + 1] = 0; rep[c * NM + 2] = 0;
          rs[c] = 0; send(UNDO)
       fi }
  :: else -> goto over
  od;
  atomic { incs[c] = 0; lv[c] = 0; send(REL) }
over:
  skip
}
#endif

init {
  atomic {
    run world();
    run pipe(0, 0); run pipe(0, 1); run pipe(0, 2);
    run pipe(1, 0); run pipe(1, 1); run pipe(1, 2);
#ifdef THIRD
    run pipe(2, 0); run pipe(2, 1); run pipe(2, 2);
    run competitor(2);
#endif
    run client(0); run client(1)
  }
}
