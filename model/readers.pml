/*
 * readers.pml -- a readers/writer lock's exclusion (reader_scripts.py and the plain lock).
 * (docs/models.md says what this proves, what it leaves out, and what to change with the Lua.)
 *
 * Mirrors READER_ACQUIRE (refused while a writer's value holds the name; else our reader key for
 * our TTL, and the 'readers' marker on the name's key raised to at least our TTL), READER_RELEASE
 * (compare-and-delete our key; the last live reader out deletes the marker), the writer's plain
 * SET NX and RELEASE (compare-and-delete), and the client's quorum (readers.attempt, which undoes
 * a lost attempt with READER_RELEASE).
 *
 * Faults: an acquiring request may land late (at most DELAYS in flight at once) or never; a
 * client may pause anywhere, also holding past its lease (the clock ticks).
 *
 * Safety, asserted at each entry into a critical section: never a writer with a valid lease
 * beside a reader with a valid lease.
 *
 * Known-bad variant -DNO_MARKER_RAISE: a reader writes the marker only where the name's key is
 * free, without raising its TTL to its own: the marker lapses under a later reader, and a
 * writer's SET NX gets in beside it.
 */

#define NM 3
#define NC 3            /* client 0 and 1 read, client 2 writes */
#define NP 9
#define Q 2
#ifndef TTL
#define TTL 2
#endif
#ifndef DELAYS
#define DELAYS 1
#endif
#define WRITER 2
#define MARK 9          /* the 'readers' marker on the name's key */

#define ACQ 1
#define UNDO 2          /* reader: READER_RELEASE quietly; writer: RELEASE of its value */
#define REL 3
#define GR 1
#define DN 2

/* per master */
byte name[NM];          /* the name's key: 0 none, MARK, or the writer's value (WRITER + 1) */
byte nt[NM];            /* ticks it lives on */
byte rk[NM * 2];        /* reader r's key on master m: m * 2 + r; 1 if there */
byte rt[NM * 2];        /* ticks it lives on (the readers set holds the same expiry) */
/* per client */
byte rs[NC];
bool awaiting[NC];
bool incs[NC];
byte lv[NC];
/* per pipe c * NM + m */
byte pend[NP];
byte rep[NP];

#define inflight ((pend[0] != 0) + (pend[1] != 0) + (pend[2] != 0) + (pend[3] != 0) + (pend[4] != 0) + (pend[5] != 0) + (pend[6] != 0) + (pend[7] != 0) + (pend[8] != 0))

inline serve(c, m, r) {
  if
  :: c != WRITER && r == ACQ ->       /* READER_ACQUIRE */
     if
     :: name[m] != 0 && name[m] != MARK -> out = DN
     :: else ->
        rk[m * 2 + c] = 1; rt[m * 2 + c] = TTL;
#ifndef NO_MARKER_RAISE
        if :: nt[m] < TTL -> name[m] = MARK; nt[m] = TTL :: else fi;
#else
        if :: name[m] == 0 -> name[m] = MARK; nt[m] = TTL :: else fi;
#endif
        out = GR
     fi
  :: c != WRITER && r != ACQ ->       /* READER_RELEASE */
     if
     :: rk[m * 2 + c] ->
        rk[m * 2 + c] = 0; rt[m * 2 + c] = 0;
        if
        :: rk[m * 2 + 1 - c] == 0 && name[m] == MARK -> name[m] = 0; nt[m] = 0
        :: else
        fi;
        out = GR
     :: else -> out = DN
     fi
  :: c == WRITER && r == ACQ ->       /* SET NX PX */
     if
     :: name[m] == 0 -> name[m] = WRITER + 1; nt[m] = TTL; out = GR
     :: else -> out = DN
     fi
  :: else ->                          /* RELEASE: compare-and-delete */
     if
     :: name[m] == WRITER + 1 -> name[m] = 0; nt[m] = 0; out = GR
     :: else -> out = DN
     fi
  fi
}

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
       :: i < NM -> dec(nt[i]); if :: nt[i] == 0 -> name[i] = 0 :: else fi; i++
       :: else -> break
       od;
       i = 0;
       do
       :: i < NM * 2 -> dec(rt[i]); if :: rt[i] == 0 -> rk[i] = 0 :: else fi; i++
       :: else -> break
       od;
       i = 0;
       do
       :: i < NC -> dec(rs[i]); dec(lv[i]); i++
       :: else -> break
       od;
       i = 0 }
  od
}

#define valid(c) (incs[c] && lv[c] > 0)
#define votes(c) ((rep[c * NM] == GR) + (rep[c * NM + 1] == GR) + (rep[c * NM + 2] == GR))

proctype client(byte c) {
  byte m, out;
  atomic { rs[c] = TTL; send(ACQ) }
  atomic {
    if
    :: votes(c) >= Q && rs[c] > 0 ->
       awaiting[c] = 0; rep[c * NM] = 0; rep[c * NM + 1] = 0; rep[c * NM + 2] = 0;
       incs[c] = 1; lv[c] = rs[c]; rs[c] = 0;
       /* the safety property: a valid writer never beside a valid reader */
       assert(!(valid(WRITER) && (valid(0) || valid(1))))
    :: else ->
       awaiting[c] = 0; rep[c * NM] = 0; rep[c * NM + 1] = 0; rep[c * NM + 2] = 0;
       rs[c] = 0; send(UNDO); goto done
    fi
  }
  /* the critical section (a pause here may outlast the lease) */
  atomic { incs[c] = 0; lv[c] = 0; send(REL) }
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
