/*
 * qnn_queue.c: asynchronous submission. One worker thread (xpu_sync.h's queue) runs
 * submissions in the order they were made, like the NPU's single queue: it waits for each
 * one's fences, executes it, signals its fence (with the failure status when it failed),
 * unpins its buffers and clears its in-flight mark. The worker starts with the first
 * submission and is joined by shutdown.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qnn_plugin.h"

typedef struct qjob {
  xpu_queue_item item; /* first: the queue hands it back */
  xpu_execution h;
  qexec *x;
  qbuf **bufs;
  qfence **waits;
  uint64_t *wait_values;
  uint32_t n_waits;
  qfence *signal;
  uint64_t signal_value;
} qjob;

void queue_run(xpu_queue_item *item, const int *stop) {
  qjob *j = (qjob *)item;
  xpu_status st = XPU_OK;
  for (uint32_t i = 0; i < j->n_waits && st == XPU_OK; i++) {
    st = xpu_timeline_wait(&j->waits[i]->tl, j->wait_values[i], -1, stop);
    if (st == XPU_E_BAD_STATE && __atomic_load_n(stop, __ATOMIC_ACQUIRE)) st = XPU_E_DEVICE_LOST; /* shutting down */
    if (st != XPU_OK)
      xpu_fail(&qnn_reg, j->h, st, "execution_submit: wait point %u (value %llu) failed: %s", i,
               (unsigned long long)j->wait_values[i], xpu_status_name(st));
  }
  if (st == XPU_OK) st = exec_pinned(j->h, j->x, j->bufs, "execution_submit");
  /* everything the host may release once it sees the signal is let go before the signal */
  exec_unpin(j->bufs, j->x->exe->n_in + j->x->exe->n_out);
  for (uint32_t i = 0; i < j->n_waits; i++) fence_unref(j->waits[i]);
  atomic_store(&j->x->in_flight, 0); /* the execution may be released from here on */
  if (j->signal) fence_set_unref(j->signal, j->signal_value, st);
  free(j->bufs);
  free(j->waits);
  free(j->wait_values);
  free(j);
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
  *j = (qjob){{NULL}, h, x, bufs, wait_fences, values, n_waits, signal, signal_value};
  xpu_status st = xpu_queue_push(&qnn_state.queue, &j->item);
  if (st != XPU_OK) {
    free(j);
    free(values);
    return xpu_fail(&qnn_reg, h, st == XPU_E_BAD_STATE ? st : XPU_E_INTERNAL,
                    st == XPU_E_BAD_STATE ? "execution_submit: the plugin is shutting down"
                                          : "execution_submit: cannot start the submission thread");
  }
  return XPU_OK;
}

void queue_stop(void) {
  xpu_queue_stop(&qnn_state.queue);
  xpu_queue_reset(&qnn_state.queue); /* the plugin may be opened again */
}
