/*
 * quarantine.pml -- the restart and failover quarantine (quarantine.py): handoff.pml with
 * master 0 restarting empty once (its keys, its queue and the requests in flight to it gone),
 * after which its votes, by reply or by hand-off word, count only after MAX_TTL (here TTL
 * ticks: every lease's TTL is at most MAX_TTL). One attempt per acquisition bounds the state
 * space. Known-bad variant -DNO_QUARANTINE: the restarted member votes at once, and a lease
 * granted before the restart is held twice.
 */
#define RESTART
#ifndef TRIES
#define TRIES 1
#endif
#include "handoff.pml"
