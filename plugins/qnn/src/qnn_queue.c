/*
 * qnn_queue.c: asynchronous submission. One worker thread runs submissions in the order they
 * were made, like the NPU's single queue: it waits for each one's fences, executes it, signals
 * its fence (with the failure status when it failed), unpins its buffers and clears its
 * in-flight mark. The worker starts with the first submission and is joined by shutdown.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qnn_plugin.h"

typedef struct qjob {
  struct qjob *next;
  xpu_execution h;
  qexec *x;
  qbuf **bufs;
  qfence **waits;
  uint64_t *wait_values;
  uint32_t n_waits;
  qfence *signal;
  uint64_t signal_value;
} qjob;

/* waits in slices so a stopping plugin is noticed even while a fence is never signalled */
static xpu_status wait_stoppable(qfence *f, uint64_t value) {
  for (;;) {
    xpu_status st = fence_wait_on(f, value, 20 * 1000 * 1000);
    if (st != XPU_E_TIMEOUT) return st;
    pthread_mutex_lock(&qnn_state.queue_mu);
    int stop = qnn_state.stopping;
    pthread_mutex_unlock(&qnn_state.queue_mu);
    if (stop) return XPU_E_DEVICE_LOST;
  }
}

static void run_job(qjob *j) {
  xpu_status st = XPU_OK;
  for (uint32_t i = 0; i < j->n_waits && st == XPU_OK; i++) {
    st = wait_stoppable(j->waits[i], j->wait_values[i]);
    if (st != XPU_OK)
      xpu_fail(&qnn_reg, j->h, st, "execution_submit: wait point %u (value %llu) failed: %s", i,
               (unsigned long long)j->wait_values[i], xpu_status_name(st));
  }
  if (st == XPU_OK) st = exec_pinned(j->h, j->x, j->bufs, "execution_submit");
  /* everything the host may release once it sees the signal is let go before the signal */
  exec_unpin(j->bufs, j->x->exe->n_in + j->x->exe->n_out);
  for (uint32_t i = 0; i < j->n_waits; i++) fence_unref(j->waits[i]);
  atomic_store(&j->x->in_flight, 0); /* the execution may be released from here on */
  if (j->signal) {
    /* signal and drop the reference atomically with respect to fence_release */
    pthread_mutex_lock(&qnn_state.refs_mu);
    fence_set(j->signal, j->signal_value, st);
    j->signal->refs--;
    pthread_mutex_unlock(&qnn_state.refs_mu);
  }
  free(j->bufs);
  free(j->waits);
  free(j->wait_values);
  free(j);
}

static void *worker(void *arg) {
  (void)arg;
  pthread_mutex_lock(&qnn_state.queue_mu);
  for (;;) {
    while (!qnn_state.head && !qnn_state.stopping) pthread_cond_wait(&qnn_state.queue_cv, &qnn_state.queue_mu);
    qjob *j = qnn_state.head;
    if (!j) break; /* stopping and drained */
    qnn_state.head = j->next;
    if (!qnn_state.head) qnn_state.tail = NULL;
    pthread_mutex_unlock(&qnn_state.queue_mu);
    run_job(j);
    pthread_mutex_lock(&qnn_state.queue_mu);
  }
  pthread_mutex_unlock(&qnn_state.queue_mu);
  return NULL;
}

xpu_status queue_submit(xpu_execution h, qexec *x, qbuf **bufs, const xpu_fence_point *waits, uint32_t n_waits,
                        qfence **wait_fences, qfence *signal, uint64_t signal_value) {
  qjob *j = calloc(1, sizeof *j);
  uint64_t *values = calloc(n_waits ? n_waits : 1, sizeof *values);
  if (!j || !values) {
    free(j);
    free(values);
    return xpu_fail(&qnn_reg, h, XPU_E_OUT_OF_MEMORY, "execution_submit: out of memory");
  }
  for (uint32_t i = 0; i < n_waits; i++) values[i] = waits[i].value;
  *j = (qjob){NULL, h, x, bufs, wait_fences, values, n_waits, signal, signal_value};
  pthread_mutex_lock(&qnn_state.queue_mu);
  if (!qnn_state.worker_running) {
    qnn_state.stopping = 0;
    if (pthread_create(&qnn_state.worker, NULL, worker, NULL) != 0) {
      pthread_mutex_unlock(&qnn_state.queue_mu);
      free(j);
      free(values);
      return xpu_fail(&qnn_reg, h, XPU_E_INTERNAL, "execution_submit: cannot start the submission thread");
    }
    qnn_state.worker_running = 1;
  }
  if (qnn_state.tail) qnn_state.tail->next = j;
  else qnn_state.head = j;
  qnn_state.tail = j;
  pthread_cond_signal(&qnn_state.queue_cv);
  pthread_mutex_unlock(&qnn_state.queue_mu);
  return XPU_OK;
}

void queue_stop(void) {
  pthread_mutex_lock(&qnn_state.queue_mu);
  int running = qnn_state.worker_running;
  qnn_state.stopping = 1;
  pthread_cond_broadcast(&qnn_state.queue_cv);
  pthread_mutex_unlock(&qnn_state.queue_mu);
  if (running) pthread_join(qnn_state.worker, NULL);
  pthread_mutex_lock(&qnn_state.queue_mu);
  qnn_state.worker_running = 0;
  pthread_mutex_unlock(&qnn_state.queue_mu);
}
