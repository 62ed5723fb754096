/*
 * pool.c: the plugin's thread pool. Workers are created once per context and sleep between
 * parallel regions; a region is published by bumping a generation counter. Pinning is applied
 * lazily when a region asks for a different CPU set than the current one, so an executable
 * prepared for the "decode" cores and one for the "prefill" cores can alternate cheaply.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "neon.h"

typedef struct nv_worker {
  /* the region this worker is asked to take part in: the caller bumps it only for the workers a
   * region needs, so a worker a region leaves out (the spare one when the calling thread runs
   * task 0 itself) neither competes for a core nor holds the region up by acknowledging it */
  _Alignas(64) atomic_uint_fast64_t go;
  atomic_int asleep; /* past its spin, waiting on cv_work */
  nv_pool *pool;
  int tid;
  pthread_t th;
} nv_worker;

/* pause iterations a worker spins for its next region before it sleeps, and the caller for the
 * region's end before it sleeps: decode runs hundreds of small regions per token, and a sleep
 * costs a wake-up (tens of microseconds on a VM), more than many regions compute */
#define SPIN 20000
#define SPIN_WAIT 20000

/* Past the first thousand pauses (which cover a quiet machine's gaps between regions) a
 * spinning thread gives its core away now and then: beside another busy thread (a second
 * program, or one of ours descheduled) a pure spin would hold the core the awaited thread needs.
 * Beside a busy loop on one of two cores, a pure spin decoded at a third of this speed. */
static inline void spin_step(int i) {
  if (i > 1000 && (i & 63) == 63) sched_yield();
}

static inline void cpu_relax(void) {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

struct nv_pool {
  pthread_mutex_t run_mu; /* one region at a time: concurrent executions take turns per node */
  pthread_mutex_t mu;     /* guards the sleeping sides: workers on cv_work, the caller on cv_done */
  pthread_cond_t cv_work, cv_done;
  int n;
  nv_worker *w;
  uint64_t gen;             /* the last region published (written under run_mu only) */
  atomic_int pending;       /* workers that have not yet finished the current region */
  atomic_int waiter;        /* the caller is past its spin, waiting on cv_done */
  atomic_int stop;
  int nth;
  int first; /* task index of worker 0: 1 when the calling thread runs task 0 itself */
  nv_task_fn fn;
  void *arg;
  nv_cpuset pinned, base;
};

static void *worker_main(void *p_) {
  nv_worker *w = (nv_worker *)p_;
  nv_pool *p = w->pool;
  uint64_t seen = 0;
  for (;;) {
    uint64_t g = atomic_load_explicit(&w->go, memory_order_acquire);
    for (int i = 0; i < SPIN && g == seen; i++) {
      cpu_relax();
      spin_step(i);
      g = atomic_load_explicit(&w->go, memory_order_acquire);
    }
    if (g == seen) {
      /* seq_cst, as the caller's go store and asleep load: either the caller sees asleep set and
       * wakes this worker, or this worker sees the new go below and does not wait */
      atomic_store(&w->asleep, 1);
      pthread_mutex_lock(&p->mu);
      while (!atomic_load(&p->stop) && (g = atomic_load(&w->go)) == seen) pthread_cond_wait(&p->cv_work, &p->mu);
      pthread_mutex_unlock(&p->mu);
      atomic_store(&w->asleep, 0);
    }
    if (atomic_load(&p->stop)) break;
    seen = g;
    /* the region's fields are stable until every worker it asked for has finished */
    p->fn(p->arg, w->tid + p->first, p->nth);
    if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->waiter)) {
      pthread_mutex_lock(&p->mu);
      pthread_cond_signal(&p->cv_done);
      pthread_mutex_unlock(&p->mu);
    }
  }
  return NULL;
}

static void pin_all(nv_pool *p, const nv_cpuset *s) {
  if (s->n == p->pinned.n && memcmp(s->cpu, p->pinned.cpu, sizeof(int) * (size_t)s->n) == 0) return;
  for (int i = 0; i < p->n; i++) {
    cpu_set_t cs;
    CPU_ZERO(&cs);
    if (s->n == 0) {
      /* unpinned: every online CPU */
      long ncpu = sysconf(_SC_NPROCESSORS_CONF);
      for (long c = 0; c < ncpu && c < CPU_SETSIZE; c++) CPU_SET((int)c, &cs);
    } else {
      CPU_SET(s->cpu[i % s->n], &cs);
    }
    /* a CPU outside the cgroup's set fails: the worker then stays where it was */
    (void)pthread_setaffinity_np(p->w[i].th, sizeof cs, &cs);
  }
  p->pinned = *s;
}

nv_pool *nv_pool_create(int n, const nv_cpuset *cpus, char *err, size_t errcap) {
  nv_pool *p = (nv_pool *)calloc(1, sizeof *p);
  if (!p || n < 1) {
    free(p);
    snprintf(err, errcap, "thread pool: out of memory");
    return NULL;
  }
  p->w = (nv_worker *)calloc((size_t)n, sizeof(nv_worker));
  if (!p->w) {
    free(p);
    snprintf(err, errcap, "thread pool: out of memory");
    return NULL;
  }
  pthread_mutex_init(&p->run_mu, NULL);
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv_work, NULL);
  pthread_cond_init(&p->cv_done, NULL);
  for (int i = 0; i < n; i++) {
    p->w[i].pool = p;
    p->w[i].tid = i;
    int rc = pthread_create(&p->w[i].th, NULL, worker_main, &p->w[i]);
    if (rc != 0) {
      p->n = i;
      nv_pool_destroy(p);
      snprintf(err, errcap, "thread pool: pthread_create: %s", strerror(rc));
      return NULL;
    }
    p->n = i + 1;
  }
  if (cpus) p->base = *cpus;
  pin_all(p, &p->base);
  return p;
}

void nv_pool_destroy(nv_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  atomic_store(&p->stop, 1);
  pthread_cond_broadcast(&p->cv_work);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->n; i++) pthread_join(p->w[i].th, NULL);
  pthread_cond_destroy(&p->cv_work);
  pthread_cond_destroy(&p->cv_done);
  pthread_mutex_destroy(&p->mu);
  pthread_mutex_destroy(&p->run_mu);
  free(p->w);
  free(p);
}

int nv_pool_size(const nv_pool *p) { return p->n; }

/* Worker 0 takes part in every region of two or more threads: whether it sleeps says whether
 * the next region pays a wake-up. */
int nv_pool_sleeping(nv_pool *p) { return atomic_load_explicit(&p->w[0].asleep, memory_order_relaxed); }

void nv_pool_run(nv_pool *p, const nv_cpuset *cpus, int nth, nv_task_fn fn, void *arg) {
  if (nth > p->n) nth = p->n;
  if (nth < 1) nth = 1;
  const nv_cpuset *want = cpus ? cpus : &p->base;
  if (nth == 1 && want->n == 0) {
    fn(arg, 0, 1);
    return;
  }
  pthread_mutex_lock(&p->run_mu);
  pin_all(p, want);
  p->fn = fn;
  p->arg = arg;
  p->nth = nth;
  /* Unpinned, the calling thread runs task 0 itself: on a small CPU a caller that only waited
   * would compete with the workers for the cores. Pinned, every task runs on a pinned worker
   * (the host's thread is not ours to pin) and the caller waits. */
  p->first = want->n == 0 ? 1 : 0;
  int k = nth - p->first; /* workers this region asks for: tids 0..k-1 */
  atomic_store(&p->pending, k);
  p->gen++;
  int wake = 0;
  for (int i = 0; i < k; i++) atomic_store(&p->w[i].go, p->gen);
  /* only a worker this region asks for is worth a wake-up: the spare one of an unpinned context
   * sleeps for good, and waking it every region would cost a futex call per region */
  for (int i = 0; i < k && !wake; i++) wake = atomic_load(&p->w[i].asleep);
  if (wake) {
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
  }
  if (p->first) fn(arg, 0, nth);
  /* pinned, this thread may share a CPU with a worker: it waits briefly, then sleeps */
  int spin = p->first ? SPIN_WAIT : SPIN_WAIT / 80;
  for (int i = 0; i < spin && atomic_load_explicit(&p->pending, memory_order_acquire) > 0; i++) {
    cpu_relax();
    spin_step(i);
  }
  if (atomic_load(&p->pending) > 0) {
    /* seq_cst on both sides: either the last worker sees waiter set and signals, or this
     * thread sees pending at zero */
    atomic_store(&p->waiter, 1);
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&p->pending) > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    atomic_store(&p->waiter, 0);
  }
  pthread_mutex_unlock(&p->run_mu);
}

int nv_parse_cpus(const char *s, nv_cpuset *set) {
  set->n = 0;
  const char *p = s;
  while (*p) {
    char *end;
    long a = strtol(p, &end, 10);
    if (end == p || a < 0 || a >= CPU_SETSIZE) return -1;
    long b = a;
    p = end;
    if (*p == '-') {
      p++;
      b = strtol(p, &end, 10);
      if (end == p || b < a || b >= CPU_SETSIZE) return -1;
      p = end;
    }
    for (long c = a; c <= b; c++) {
      if (set->n >= NV_MAX_CPUS) return -1;
      set->cpu[set->n++] = (int)c;
    }
    if (*p == ',') {
      p++;
      if (!*p) return -1;
    } else if (*p) {
      return -1;
    }
  }
  return set->n > 0 ? 0 : -1;
}

int nv_cpus_offline(const nv_cpuset *set) {
  char buf[1024];
  nv_cpuset online;
  int have = 0;
  FILE *f = fopen("/sys/devices/system/cpu/online", "r");
  if (f) {
    if (fgets(buf, sizeof buf, f)) {
      buf[strcspn(buf, "\n")] = 0;
      have = nv_parse_cpus(buf, &online) == 0;
    }
    fclose(f);
  }
  long conf = sysconf(_SC_NPROCESSORS_CONF);
  for (int i = 0; i < set->n; i++) {
    int c = set->cpu[i], ok = 0;
    if (have) {
      for (int j = 0; j < online.n && !ok; j++) ok = online.cpu[j] == c;
    } else {
      ok = conf < 1 || c < conf;
    }
    if (!ok) return c;
  }
  return -1;
}
