/*
 * qnn_lib.c: finding, opening and starting the QNN backend library. The library is dlopen'ed
 * at run time so the plugin loads (and probes 0 with the reason) on machines without an SDK.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qnn_plugin.h"

#if defined(__aarch64__) && defined(__ANDROID__)
#define QNN_SDK_ARCH "aarch64-android"
#elif defined(__aarch64__)
#define QNN_SDK_ARCH "aarch64-oe-linux-gcc11.2"
#else
#define QNN_SDK_ARCH "x86_64-linux-clang"
#endif

#define QNN_EMU_NAME "libQnnXpuEmu.so"

static int readable(const char *p) { return p && p[0] && access(p, R_OK) == 0; }

int qnn_lib_find(const char *plugin_dir, char *path, size_t cap, char *reason, size_t rcap) {
  if (!path || !cap || !reason || !rcap) return 0;
  const char *env = getenv("XPU_QNN_LIBRARY");
  if (env && env[0]) {
    if (readable(env)) {
      snprintf(path, cap, "%s", env);
      return 1;
    }
    snprintf(reason, rcap, "XPU_QNN_LIBRARY=%s is not readable", env);
    return 0;
  }
  const char *sdk = getenv("QNN_SDK_ROOT");
  if (sdk && sdk[0]) {
    /* the HTP first: the NPU is the point; libQnnCpu.so is the float reference backend */
    static const char *const libs[] = {"libQnnHtp.so", "libQnnCpu.so"};
    for (size_t i = 0; i < 2; i++) {
      snprintf(path, cap, "%s/lib/%s/%s", sdk, QNN_SDK_ARCH, libs[i]);
      if (readable(path)) return 1;
    }
    snprintf(reason, rcap, "QNN_SDK_ROOT=%s has no lib/%s/libQnnHtp.so or libQnnCpu.so", sdk, QNN_SDK_ARCH);
    return 0;
  }
  if (plugin_dir && plugin_dir[0]) {
    /* beside the plugin: a real library shipped with an app first, then the emulator that
     * `make` builds into build/plugins/qnn/ */
    static const char *const rel[] = {"libQnnHtp.so", "libQnnCpu.so", "qnn/" QNN_EMU_NAME, QNN_EMU_NAME};
    for (size_t i = 0; i < 4; i++) {
      snprintf(path, cap, "%s/%s", plugin_dir, rel[i]);
      if (readable(path)) return 1;
    }
  }
  snprintf(reason, rcap,
           "no QNN backend library: set XPU_QNN_LIBRARY or QNN_SDK_ROOT, or put libQnnHtp.so beside the plugin");
  return 0;
}

xpu_status qnn_lib_load(qnn_lib *l, const char *path, char *err, size_t cap) {
  memset(l, 0, sizeof *l);
  snprintf(l->path, sizeof l->path, "%s", path);
  l->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!l->dl) {
    const char *e = dlerror();
    snprintf(err, cap, "dlopen %s: %s", path, e ? e : "failed");
    return XPU_E_MISSING_DEP;
  }
  QnnInterfaceGetProvidersFn_t get = (QnnInterfaceGetProvidersFn_t)dlsym(l->dl, QNN_GET_PROVIDERS_SYMBOL);
  if (!get) {
    snprintf(err, cap, "%s does not export %s: not a QNN backend", path, QNN_GET_PROVIDERS_SYMBOL);
    return XPU_E_INCOMPATIBLE;
  }
  const QnnInterface_t **list = NULL;
  uint32_t n = 0;
  if (get(&list, &n) != QNN_SUCCESS || !list || n == 0) {
    snprintf(err, cap, "%s: QnnInterface_getProviders returned no provider", path);
    return XPU_E_INCOMPATIBLE;
  }
  /* the highest minor of major 2 that is at least what these declarations describe: the table
   * only grows, so a newer minor keeps every slot we call where we expect it */
  const QnnInterface_t *best = NULL;
  for (uint32_t i = 0; i < n; i++) {
    const QnnInterface_t *p = list[i];
    if (!p || p->apiVersion.coreApiVersion.major != QNN_API_MAJOR_PINNED ||
        p->apiVersion.coreApiVersion.minor < QNN_API_MINOR_PINNED)
      continue;
    if (!best || p->apiVersion.coreApiVersion.minor > best->apiVersion.coreApiVersion.minor) best = p;
  }
  if (!best) {
    const QnnInterface_t *p = list[0];
    snprintf(err, cap, "%s: QNN core API %u.%u, this plugin needs %u.%u or a later 2.x", path,
             p ? p->apiVersion.coreApiVersion.major : 0, p ? p->apiVersion.coreApiVersion.minor : 0,
             QNN_API_MAJOR_PINNED, QNN_API_MINOR_PINNED);
    return XPU_E_INCOMPATIBLE;
  }
  l->iface = best;
  l->fn = &best->v2_18;
  l->backend_id = best->backendId;
  snprintf(l->provider, sizeof l->provider, "%s", best->providerName ? best->providerName : "?");
  l->emulated = best->backendId == QNN_BACKEND_ID_XPU_EMU;
  l->target = l->backend_id;
  if (l->emulated) l->target = strstr(l->provider, "XPU_QNN_EMULATOR/CPU") ? QNN_BACKEND_ID_CPU : QNN_BACKEND_ID_HTP;
  const QnnInterfaceTable_t *f = l->fn;
  if (!f->backendCreate || !f->backendFree || !f->contextCreate || !f->contextFree || !f->graphCreate ||
      !f->graphAddNode || !f->graphFinalize || !f->graphExecute || !f->tensorCreateGraphTensor) {
    snprintf(err, cap, "%s: provider %s lacks a core graph entry point", path, l->provider);
    return XPU_E_INCOMPATIBLE;
  }
  const char *id = NULL;
  if (f->backendGetBuildId && f->backendGetBuildId(&id) == QNN_SUCCESS && id)
    snprintf(l->build_id, sizeof l->build_id, "%s", id);
  else
    snprintf(l->build_id, sizeof l->build_id, "unknown");
  return XPU_OK;
}

const char *qnn_lib_errmsg(const qnn_lib *l, Qnn_ErrorHandle_t e) {
  const char *m = NULL;
  if (l && l->fn && l->fn->errorGetMessage && l->fn->errorGetMessage(e, &m) == QNN_SUCCESS && m) return m;
  return "no message";
}

int qnn_perf_mode(const char *s) {
  if (strcmp(s, "burst") == 0) return QNN_PERF_BURST;
  if (strcmp(s, "balanced") == 0) return QNN_PERF_BALANCED;
  if (strcmp(s, "off") == 0) return QNN_PERF_OFF;
  return -1;
}

/* The HTP's power vote (QnnHtpPerfInfrastructure), context option perf=burst (the default: DCVS
 * off, performance mode, sleep disabled, bus and core at the highest voltage corner, FastRPC
 * polling), balanced (DCVS on between SVS and TURBO, the NOM target) or off (the backend's
 * default vote). A refused vote is logged, never fatal: graphs run at whatever clock there is. */
static void htp_power_vote(qnn_lib *l, int mode) {
  l->power_mode = mode;
  if (mode == QNN_PERF_OFF) return;
  int burst = mode == QNN_PERF_BURST;
  const QnnHtpDevice_Infrastructure_t *infra = NULL;
  const QnnInterfaceTable_t *f = l->fn;
  if (!f->deviceGetInfrastructure || f->deviceGetInfrastructure(&infra) != QNN_SUCCESS || !infra ||
      infra->infraType != QNN_HTP_DEVICE_INFRASTRUCTURE_TYPE_PERF || !infra->perfInfra.createPowerConfigId ||
      !infra->perfInfra.setPowerConfig) {
    xpu_log(&qnn_reg, XPU_LOG_WARN, "qnn: the HTP offers no perf infrastructure: no power vote");
    return;
  }
  uint32_t id = 0;
  Qnn_ErrorHandle_t e = infra->perfInfra.createPowerConfigId(0, 0, &id);
  if (e != QNN_SUCCESS) {
    xpu_log(&qnn_reg, XPU_LOG_WARN, "qnn: createPowerConfigId: error %llu: %s", (unsigned long long)e, qnn_lib_errmsg(l, e));
    return;
  }
  QnnHtpPerfInfrastructure_PowerConfig_t dcvs, lat, poll;
  memset(&dcvs, 0, sizeof dcvs);
  memset(&lat, 0, sizeof lat);
  memset(&poll, 0, sizeof poll);
  dcvs.option = QNN_HTP_PERF_INFRASTRUCTURE_POWER_CONFIGOPTION_DCVS_V3;
  QnnHtpPerfInfrastructure_DcvsV3_t *d = &dcvs.dcvsV3Config;
  d->contextId = id;
  d->setDcvsEnable = d->setSleepLatency = d->setSleepDisable = d->setBusParams = d->setCoreParams = 1;
  d->dcvsEnable = burst ? 0 : 1;
  d->powerMode = burst ? QNN_HTP_PERF_INFRASTRUCTURE_POWERMODE_PERFORMANCE_MODE : QNN_HTP_PERF_INFRASTRUCTURE_POWERMODE_ADJUST_UP_DOWN;
  d->sleepLatency = burst ? 40 : 1000; /* microseconds */
  d->sleepDisable = burst ? 1 : 0;
  d->busVoltageCornerMin = d->coreVoltageCornerMin = burst ? DCVS_VOLTAGE_VCORNER_MAX_VOLTAGE_CORNER : DCVS_VOLTAGE_VCORNER_SVS;
  d->busVoltageCornerTarget = d->coreVoltageCornerTarget = burst ? DCVS_VOLTAGE_VCORNER_MAX_VOLTAGE_CORNER : DCVS_VOLTAGE_VCORNER_NOM;
  d->busVoltageCornerMax = d->coreVoltageCornerMax = burst ? DCVS_VOLTAGE_VCORNER_MAX_VOLTAGE_CORNER : DCVS_VOLTAGE_VCORNER_TURBO;
  lat.option = QNN_HTP_PERF_INFRASTRUCTURE_POWER_CONFIGOPTION_RPC_CONTROL_LATENCY;
  lat.rpcControlLatencyConfig = 100; /* microseconds */
  poll.option = QNN_HTP_PERF_INFRASTRUCTURE_POWER_CONFIGOPTION_RPC_POLLING_TIME;
  poll.rpcPollingTimeConfig = 9999; /* microseconds, the documented maximum */
  const QnnHtpPerfInfrastructure_PowerConfig_t *cfgs[4] = {&dcvs, &lat, burst ? &poll : NULL, NULL};
  if ((e = infra->perfInfra.setPowerConfig(id, cfgs)) != QNN_SUCCESS) {
    xpu_log(&qnn_reg, XPU_LOG_WARN, "qnn: setPowerConfig: error %llu: %s", (unsigned long long)e, qnn_lib_errmsg(l, e));
    if (infra->perfInfra.destroyPowerConfigId) infra->perfInfra.destroyPowerConfigId(id);
    return;
  }
  l->power_id = id;
}

static void htp_power_release(qnn_lib *l) {
  const QnnHtpDevice_Infrastructure_t *infra = NULL;
  if (!l->power_id || !l->fn->deviceGetInfrastructure || l->fn->deviceGetInfrastructure(&infra) != QNN_SUCCESS || !infra ||
      !infra->perfInfra.destroyPowerConfigId)
    return;
  infra->perfInfra.destroyPowerConfigId(l->power_id);
  l->power_id = 0;
}

xpu_status qnn_lib_start(qnn_lib *l, char *err, size_t cap) {
  if (l->backend) return XPU_OK;
  const QnnInterfaceTable_t *f = l->fn;
  Qnn_ErrorHandle_t e;
  /* a NULL callback lets the backend log to its default stream, and only errors */
  if (f->logCreate && (e = f->logCreate(NULL, QNN_LOG_LEVEL_ERROR, &l->log)) != QNN_SUCCESS) l->log = NULL;
  if ((e = f->backendCreate(l->log, NULL, &l->backend)) != QNN_SUCCESS) {
    snprintf(err, cap, "QNN backendCreate: error %llu: %s", (unsigned long long)e, qnn_lib_errmsg(l, e));
    l->backend = NULL;
    qnn_lib_stop(l);
    return XPU_E_DEVICE_LOST;
  }
  /* some backends (CPU) have no device API: NULL device is then the default */
  if (f->deviceCreate && (e = f->deviceCreate(l->log, NULL, &l->device)) != QNN_SUCCESS) l->device = NULL;
  if (l->target == QNN_BACKEND_ID_HTP) htp_power_vote(l, QNN_PERF_BURST);
  return XPU_OK;
}

void qnn_lib_power(qnn_lib *l, int mode) {
  if (l->target != QNN_BACKEND_ID_HTP || mode == l->power_mode) return;
  htp_power_release(l);
  htp_power_vote(l, mode);
}

void qnn_lib_stop(qnn_lib *l) {
  const QnnInterfaceTable_t *f = l->fn;
  if (!f) return;
  htp_power_release(l);
  if (l->device && f->deviceFree) f->deviceFree(l->device);
  if (l->backend) f->backendFree(l->backend);
  if (l->log && f->logFree) f->logFree(l->log);
  l->device = l->backend = l->log = NULL;
}
