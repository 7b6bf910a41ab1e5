/*
 * timeshift: an LD_PRELOAD shim that moves the wall clock of a process (and, through the
 * inherited environment, of every process it starts) by TIMESHIFT_SECS seconds.
 *
 * Why not libfaketime: Debian's libfaketime 0.9.10 recurses into itself inside
 * redis-server (its jemalloc asks for the time while libfaketime initialises, and
 * libfaketime's own dlsym allocates), so redis-server never starts under it. This shim
 * never calls dlsym or malloc: it asks the kernel directly and adds the offset.
 *
 * Only the wall clock moves (CLOCK_REALTIME and its coarse variant, gettimeofday, time);
 * monotonic clocks are untouched, so timeouts and sleeps behave as usual.
 * Used by scripts/test-timeshift; not part of the shipped binary.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long offset_secs(void) {
    static long long offset = 0;
    static int read_once = 0;
    if (!read_once) {
        const char *text = getenv("TIMESHIFT_SECS");
        offset = text ? atoll(text) : 0;
        read_once = 1;
    }
    return offset;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    long r = syscall(SYS_clock_gettime, clock, ts);
    if (r == 0 && ts && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
        ts->tv_sec += offset_secs();
    }
    return (int)r;
}

int gettimeofday(struct timeval *tv, void *tz) {
    long r = syscall(SYS_gettimeofday, tv, tz);
    if (r == 0 && tv) {
        tv->tv_sec += offset_secs();
    }
    return (int)r;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) {
        return (time_t)-1;
    }
    if (out) {
        *out = ts.tv_sec;
    }
    return ts.tv_sec;
}
