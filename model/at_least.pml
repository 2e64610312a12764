/*
 * at_least.pml -- at_least's finishing rewrite against a late renewal (holding.finish).
 * (docs/models.md says what this proves, what it leaves out, and what to change with the Lua.)
 *
 * Client 0 takes the lock (SET NX on a quorum), its watchdog renews it (EXTEND: only where the
 * key holds our value) on connections of its own, and its body ends before its at_least: FINISH
 * (only where the key holds our value or the finished one) rewrites the key as finished, under
 * another value, with the time left to the at_least as its expiry. Client 1 tries to take the
 * lock (SET NX; a lost attempt undone by compare-and-delete).
 *
 * Faults: any request may land late (at most DELAYS in flight at once) or never, so a renewal
 * sent before the finish can land after it on some master; clients pause anywhere.
 *
 * Safety, asserted: (1) a finished key is never renewed: on every master it lapses by the
 * at_least's end; (2) once a quorum confirmed the finish, no one else holds the lock before the
 * at_least's end; (3) no two clients inside with valid leases.
 *
 * Known-bad variant -DFINISH_SAME_VALUE: FINISH keeps our value (only the expiry changes): a
 * late renewal then matches it and keeps the lock a whole TTL past the at_least.
 */

#define NM 3
#define Q 2
#define TTL 2
#define AT_LEAST 3      /* ticks from the acquisition's round start */
#ifndef DELAYS
#define DELAYS 1
#endif

#define H 1             /* client 0's value */
#define HF 2            /* ... marked finished (values.finished_value) */
#define C 3             /* client 1's value */

#define ACQ 1
#define EXT 2
#define FIN 3
#define UNDO 4
#define GR 1
#define DN 2

/* per master */
byte val[NM];
byte kt[NM];
bool fin[NM];           /* (ghost) FINISH landed here and the key is still the finished one */
/* client 0: pipes 0..2 its rounds, 3..5 its watchdog's; client 1: 6..8 */
byte pend[9];
byte rep[9];
bool awaiting[3];       /* per pipe group */
byte rs[3];            /* per pipe group: its round's validity left */
byte lv[2];
bool incs[2];
byte al;                /* ticks left until client 0's at_least ends */
bool kept;              /* a quorum confirmed its finish */

#define inflight ((pend[0] != 0) + (pend[1] != 0) + (pend[2] != 0) + (pend[3] != 0) + (pend[4] != 0) + (pend[5] != 0) + (pend[6] != 0) + (pend[7] != 0) + (pend[8] != 0))

#ifdef FINISH_SAME_VALUE
#define FINISHED H
#else
#define FINISHED HF
#endif

inline serve(g, m, r) {
  if
  :: r == ACQ ->
     if
     :: val[m] == 0 -> val[m] = (g == 2 -> C : H); kt[m] = TTL; fin[m] = 0; out = GR
     :: else -> out = DN
     fi
  :: r == EXT ->        /* EXTEND: only where the key holds our (unfinished) value */
     if
     :: val[m] == H -> kt[m] = TTL; out = GR
     :: else -> out = DN
     fi
  :: r == FIN ->        /* FINISH: our value or the finished one: rewritten, expiry = the rest */
     if
     :: val[m] == H || val[m] == HF ->
        val[m] = FINISHED; kt[m] = al; fin[m] = 1; out = GR;
        if :: al == 0 -> val[m] = 0; fin[m] = 0 :: else fi
     :: else -> out = DN
     fi
  :: r == UNDO ->       /* client 1's compare-and-delete */
     if
     :: val[m] == C -> val[m] = 0; kt[m] = 0; out = GR
     :: else -> out = DN
     fi
  fi;
  /* (1): a finished key lapses by the at_least's end, whatever lands after the finish */
  assert(!fin[m] || kt[m] <= al)
}

inline send(g, r) {
  pend[g * NM] == 0 && pend[g * NM + 1] == 0 && pend[g * NM + 2] == 0 ->
  awaiting[g] = 1;
  m = 0;
  do
  :: m < NM ->
     if
     :: serve(g, m, r);
        if :: awaiting[g] -> rep[g * NM + m] = out :: else fi
     :: inflight < DELAYS -> pend[g * NM + m] = r
     fi;
     m++
  :: else -> break
  od;
  m = 0; out = 0
}

#define votes(g) ((rep[g * NM] == GR) + (rep[g * NM + 1] == GR) + (rep[g * NM + 2] == GR))
#define over(g) awaiting[g] = 0; rep[g * NM] = 0; rep[g * NM + 1] = 0; rep[g * NM + 2] = 0

proctype pipe(byte g; byte m) {
  byte out;
end:
  do
  :: atomic { pend[g * NM + m] != 0 -> serve(g, m, pend[g * NM + m]); pend[g * NM + m] = 0;
       if :: awaiting[g] -> rep[g * NM + m] = out :: else fi;
       out = 0 }
  :: atomic { pend[g * NM + m] != 0 -> pend[g * NM + m] = 0 }
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
       :: i < NM -> dec(kt[i]); if :: kt[i] == 0 -> val[i] = 0; fin[i] = 0 :: else fi; i++
       :: else -> break
       od;
       dec(rs[0]); dec(rs[1]); dec(rs[2]); dec(lv[0]); dec(lv[1]); dec(al);
       i = 0 }
  od
}

inline enter(c) {
  incs[c] = 1;
  assert(!(incs[1 - c] && lv[1 - c] > 0 && lv[c] > 0));    /* (3) */
  assert(!(c == 1 && kept && al > 0))                       /* (2) */
}

proctype holder() {
  byte m, out;
  atomic { rs[0] = TTL; al = AT_LEAST; send(0, ACQ) }
  atomic {
    if
    :: votes(0) >= Q && rs[0] > 0 -> over(0); lv[0] = rs[0]; rs[0] = 0; enter(0)
    :: else -> over(0); rs[0] = 0; al = 0; goto done   /* (its undo: client 1's is modelled) */
    fi
  }
  /* the watchdog renews once, on its own connections; its round may be left in flight */
  if
  :: atomic { rs[1] = TTL; send(1, EXT) }
     atomic {
       if
       :: votes(1) >= Q && rs[1] > 0 && lv[0] > 0 -> lv[0] = rs[1]
       :: else
       fi;
       over(1); rs[1] = 0 }
  :: skip
  fi;
  /* the body ends: before the at_least, FINISH; then nothing of ours runs */
  atomic {
    incs[0] = 0; lv[0] = 0;
    if
    :: al > 0 -> send(0, FIN)
    :: else -> goto done
    fi }
  atomic { kept = (votes(0) >= Q); over(0) }
done:
  skip
}

proctype other() {
  byte m, out, tries;
  do
  :: tries < 2 ->
     atomic { rs[2] = TTL; send(2, ACQ) }
     atomic {
       tries++;
       if
       :: votes(2) >= Q && rs[2] > 0 -> over(2); lv[1] = rs[2]; rs[2] = 0; enter(1); break
       :: else -> over(2); rs[2] = 0; send(2, UNDO); over(2)
       fi }
  :: else -> goto done
  od;
  atomic { incs[1] = 0; lv[1] = 0 }
done:
  skip
}

init {
  atomic {
    run world();
    run pipe(0, 0); run pipe(0, 1); run pipe(0, 2);
    run pipe(1, 0); run pipe(1, 1); run pipe(1, 2);
    run pipe(2, 0); run pipe(2, 1); run pipe(2, 2);
    run holder(); run other()
  }
}
