/*
 * xpu_plugin.h: what every xpu plugin needs besides its kernels, header-only so each plugin
 * compiles it into its own .so (plugins share no library at run time).
 *
 *  - xpu_registry: uint64 handles (generation << 32 | slot) for every object, so a stale,
 *    released or foreign handle is detected instead of dereferenced; plus the last error
 *    message per handle (handle 0 = the plugin as a whole). Thread-safe.
 *  - xpu_opt_get: "key=value;key=value" option strings.
 *  - xpu_status_name, xpu_log: status names and the host's optional log sink.
 *
 * The registry is the one piece of global mutable state a plugin keeps (the ABI rule).
 */
#ifndef XPU_PLUGIN_H
#define XPU_PLUGIN_H

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xpu_backend.h"

#define XPU_ERR_LEN 512

typedef struct xpu_slot {
  void *obj;     /* NULL = free */
  uint32_t type; /* plugin-defined object type, checked on lookup */
  uint32_t gen;  /* bumped on every free, so old handles to the slot go stale */
  char err[XPU_ERR_LEN];
} xpu_slot;

typedef struct xpu_registry {
  pthread_mutex_t mu;
  xpu_slot *slots;
  uint32_t cap;
  char global_err[XPU_ERR_LEN]; /* handle 0 and unknown handles */
  xpu_log_fn log;
  void *log_user;
} xpu_registry;

#define XPU_REGISTRY_INIT {PTHREAD_MUTEX_INITIALIZER, NULL, 0, {0}, NULL, NULL}

static inline uint32_t xpu__slot_of(xpu_handle h) { return (uint32_t)(h & 0xFFFFFFFFu); }
static inline uint32_t xpu__gen_of(xpu_handle h) { return (uint32_t)(h >> 32); }

/* Adds obj; returns its handle, or 0 when out of memory. */
static inline xpu_handle xpu_reg_add(xpu_registry *r, uint32_t type, void *obj) {
  pthread_mutex_lock(&r->mu);
  uint32_t i;
  /* slot 0 is never used so that handle 0 stays "the plugin" */
  for (i = 1; i < r->cap; i++)
    if (!r->slots[i].obj) break;
  if (i >= r->cap) {
    uint32_t ncap = r->cap ? r->cap * 2 : 64;
    xpu_slot *ns = (xpu_slot *)realloc(r->slots, ncap * sizeof(xpu_slot));
    if (!ns) {
      pthread_mutex_unlock(&r->mu);
      return 0;
    }
    memset(ns + r->cap, 0, (ncap - r->cap) * sizeof(xpu_slot));
    for (uint32_t k = r->cap; k < ncap; k++) ns[k].gen = 1;
    r->slots = ns;
    i = r->cap ? r->cap : 1;
    r->cap = ncap;
  }
  r->slots[i].obj = obj;
  r->slots[i].type = type;
  r->slots[i].err[0] = 0;
  xpu_handle h = ((uint64_t)r->slots[i].gen << 32) | i;
  pthread_mutex_unlock(&r->mu);
  return h;
}

static inline xpu_slot *xpu__slot_locked(xpu_registry *r, xpu_handle h, uint32_t type) {
  uint32_t i = xpu__slot_of(h);
  if (h == 0 || i == 0 || i >= r->cap) return NULL;
  xpu_slot *s = &r->slots[i];
  if (!s->obj || s->gen != xpu__gen_of(h) || (type && s->type != type)) return NULL;
  return s;
}

/* The object of handle h if it is live and of that type (type 0: any), else NULL. */
static inline void *xpu_reg_get(xpu_registry *r, xpu_handle h, uint32_t type) {
  pthread_mutex_lock(&r->mu);
  xpu_slot *s = xpu__slot_locked(r, h, type);
  void *obj = s ? s->obj : NULL;
  pthread_mutex_unlock(&r->mu);
  return obj;
}

/* Removes h and returns its object (NULL if stale). The handle never becomes valid again. */
static inline void *xpu_reg_remove(xpu_registry *r, xpu_handle h, uint32_t type) {
  pthread_mutex_lock(&r->mu);
  xpu_slot *s = xpu__slot_locked(r, h, type);
  void *obj = NULL;
  if (s) {
    obj = s->obj;
    s->obj = NULL;
    s->gen++;
    if (s->gen == 0) s->gen = 1;
  }
  pthread_mutex_unlock(&r->mu);
  return obj;
}

/* Counts live objects of a type (type 0: all). */
static inline uint32_t xpu_reg_count(xpu_registry *r, uint32_t type) {
  uint32_t n = 0;
  pthread_mutex_lock(&r->mu);
  for (uint32_t i = 1; i < r->cap; i++)
    if (r->slots[i].obj && (!type || r->slots[i].type == type)) n++;
  pthread_mutex_unlock(&r->mu);
  return n;
}

/* Frees the slot table (plugin shutdown, after every object was released). */
static inline void xpu_reg_destroy(xpu_registry *r) {
  pthread_mutex_lock(&r->mu);
  free(r->slots);
  r->slots = NULL;
  r->cap = 0;
  pthread_mutex_unlock(&r->mu);
}

/*
 * Records msg as the last error of handle h (the plugin's own error when h is 0 or stale) and
 * returns status, so a failure path is one line: return xpu_fail(&reg, h, XPU_E_..., "...", ...).
 */
static inline xpu_status xpu_fail(xpu_registry *r, xpu_handle h, xpu_status status,
                                  const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static inline xpu_status xpu_fail(xpu_registry *r, xpu_handle h, xpu_status status,
                                  const char *fmt, ...) {
  char msg[XPU_ERR_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&r->mu);
  xpu_slot *s = xpu__slot_locked(r, h, 0);
  memcpy(s ? s->err : r->global_err, msg, XPU_ERR_LEN);
  if (s) memcpy(r->global_err, msg, XPU_ERR_LEN); /* also the plugin's latest */
  pthread_mutex_unlock(&r->mu);
  return status;
}

/* The ABI's last_error entry point. */
static inline xpu_status xpu_reg_last_error(xpu_registry *r, xpu_handle h, char *buf,
                                            uint32_t cap, uint32_t *len) {
  if (!buf && cap) return XPU_E_INVALID_ARG;
  pthread_mutex_lock(&r->mu);
  xpu_slot *s = xpu__slot_locked(r, h, 0);
  const char *msg = s ? s->err : r->global_err;
  size_t n = 0;
  while (n < XPU_ERR_LEN - 1 && msg[n]) n++;
  if (len) *len = (uint32_t)n;
  if (cap) {
    size_t c = n < cap - 1 ? n : cap - 1;
    memcpy(buf, msg, c);
    buf[c] = 0;
  }
  pthread_mutex_unlock(&r->mu);
  return XPU_OK;
}

static inline void xpu_reg_set_log(xpu_registry *r, const xpu_host_info *host) {
  if (host && host->struct_size >= offsetof(xpu_host_info, log_user) + sizeof(void *)) {
    r->log = host->log;
    r->log_user = host->log_user;
  }
}

static inline void xpu_log(xpu_registry *r, int32_t level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline void xpu_log(xpu_registry *r, int32_t level, const char *fmt, ...) {
  if (!r->log) return;
  char msg[XPU_ERR_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  r->log(r->log_user, level, msg);
}

/*
 * Finds key in "k=v;k=v" and copies its value into out (cap bytes). Returns 1 if found, 0 if
 * not, -1 if the value does not fit.
 */
static inline int xpu_opt_get(const char *opts, const char *key, char *out, size_t cap) {
  if (!opts || !key) return 0;
  size_t kl = strlen(key);
  const char *p = opts;
  while (*p) {
    while (*p == ';' || *p == ' ') p++;
    const char *end = strchr(p, ';');
    if (!end) end = p + strlen(p);
    if ((size_t)(end - p) > kl && strncmp(p, key, kl) == 0 && p[kl] == '=') {
      size_t vl = (size_t)(end - p) - kl - 1;
      if (vl + 1 > cap) return -1;
      memcpy(out, p + kl + 1, vl);
      out[vl] = 0;
      return 1;
    }
    p = end;
  }
  return 0;
}

/*
 * Host hints every backend takes and may ignore: the host passes them to every unit at once
 * (xpu run --threads N), so a backend without threads must not refuse them.
 */
#define XPU_OPT_HOST_HINTS "threads"

/*
 * Checks that every key of "k=v;k=v" is one of known (a NULL-terminated list) or a host hint,
 * so that a misspelt option (neon{thread=2}) is refused instead of silently ignored. Returns 0
 * when all are known; else -1 with a message naming the key and the known ones in err.
 */
static inline int xpu_opt_check(const char *opts, const char *const *known, char *err, size_t cap) {
  if (!opts) return 0;
  const char *p = opts;
  while (*p) {
    while (*p == ';' || *p == ' ') p++;
    if (!*p) break;
    const char *end = strchr(p, ';');
    if (!end) end = p + strlen(p);
    const char *eq = memchr(p, '=', (size_t)(end - p));
    size_t kl = eq ? (size_t)(eq - p) : (size_t)(end - p);
    int ok = eq != NULL && kl > 0;
    if (ok) {
      ok = kl == strlen(XPU_OPT_HOST_HINTS) && strncmp(p, XPU_OPT_HOST_HINTS, kl) == 0;
      for (const char *const *k = known; !ok && k && *k; k++)
        ok = strlen(*k) == kl && strncmp(p, *k, kl) == 0;
    }
    if (!ok) {
      int shown = (int)(eq ? kl : (size_t)(end - p));
      int n = snprintf(err, cap, "unknown option \"%.*s\" (this backend takes: ", shown > 64 ? 64 : shown, p);
      const char *sep = "";
      for (const char *const *k = known; k && *k && n >= 0 && (size_t)n < cap; k++, sep = ", ")
        n += snprintf(err + n, cap - (size_t)n, "%s%s", sep, *k);
      if (n >= 0 && (size_t)n < cap) snprintf(err + n, cap - (size_t)n, "%s%s)", sep, XPU_OPT_HOST_HINTS);
      return -1;
    }
    p = end;
  }
  return 0;
}

static inline const char *xpu_status_name(xpu_status s) {
  switch (s) {
  case XPU_OK: return "XPU_OK";
  case XPU_E_UNSUPPORTED: return "XPU_E_UNSUPPORTED";
  case XPU_E_INVALID_ARG: return "XPU_E_INVALID_ARG";
  case XPU_E_INVALID_HANDLE: return "XPU_E_INVALID_HANDLE";
  case XPU_E_BAD_STATE: return "XPU_E_BAD_STATE";
  case XPU_E_OUT_OF_MEMORY: return "XPU_E_OUT_OF_MEMORY";
  case XPU_E_INCOMPATIBLE: return "XPU_E_INCOMPATIBLE";
  case XPU_E_MISSING_DEP: return "XPU_E_MISSING_DEP";
  case XPU_E_DEVICE_LOST: return "XPU_E_DEVICE_LOST";
  case XPU_E_TIMEOUT: return "XPU_E_TIMEOUT";
  case XPU_E_INTERNAL: return "XPU_E_INTERNAL";
  default: return "XPU_E_UNKNOWN";
  }
}

/* Copies src into a fixed char array field, always NUL-terminated. */
#define XPU_STRCPY(dst, src)                                                                     \
  do {                                                                                           \
    strncpy((dst), (src), sizeof(dst) - 1);                                                      \
    (dst)[sizeof(dst) - 1] = 0;                                                                  \
  } while (0)

/* The callee never writes past the caller's struct_size: fill a local, copy the prefix. */
#define XPU_COPY_OUT(out, local)                                                                 \
  do {                                                                                           \
    uint32_t n_ = (out)->struct_size < sizeof(local) ? (out)->struct_size : sizeof(local);      \
    (local).struct_size = n_;                                                                    \
    memcpy((out), &(local), n_);                                                                 \
  } while (0)

#endif /* XPU_PLUGIN_H */
