/* An LD_PRELOAD shim that steps a process's wall clock: CLOCK_REALTIME (clock_gettime,
 * gettimeofday, time) reads the real clock plus the milliseconds written in the file named by
 * $CLOCKSHIFT_FILE, read again at every call (a relative name is looked up in the process's
 * current directory: redis-server's is its --dir, so each master has its own). Monotonic clocks
 * are left alone, as a wall-clock step by an administrator or a time daemon leaves them.
 *
 * Raw system calls only: no dlsym, no malloc. redis-server uses jemalloc, which reads the clock
 * while it initializes; libfaketime's dlsym then recurses into it and the server cannot start
 * (libfaketime issues #130, #327), which is why this shim exists. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long offset_ms(void) {
    const char *path = getenv("CLOCKSHIFT_FILE");
    if (path == NULL) return 0;
    long fd = syscall(SYS_openat, AT_FDCWD, path, O_RDONLY);
    if (fd < 0) return 0;
    char text[32];
    long n = syscall(SYS_read, fd, text, sizeof text - 1);
    syscall(SYS_close, fd);
    if (n <= 0) return 0;
    text[n] = '\0';
    return strtoll(text, NULL, 10);
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    long rc = syscall(SYS_clock_gettime, clock, ts);
    if (rc == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
        long long ns = (long long)ts->tv_nsec + offset_ms() * 1000000LL;
        long long seconds = ns / 1000000000LL;
        ns %= 1000000000LL;
        if (ns < 0) {
            ns += 1000000000LL;
            seconds -= 1;
        }
        ts->tv_sec += seconds;
        ts->tv_nsec = ns;
    }
    return (int)rc;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return -1;
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
    if (out != NULL) *out = ts.tv_sec;
    return ts.tv_sec;
}
