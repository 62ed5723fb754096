/*
 * qnn_api.h: our own declarations of the part of the Qualcomm QNN C API that xpu uses, written
 * from the public API documentation (docs.qualcomm.com, "QNN API overview", QnnInterface /
 * QnnTypes / QnnGraph / QnnContext / QnnMem reference pages). No Qualcomm header is copied here:
 * the SDK headers are proprietary.
 *
 * Pinned to QNN core API 2.18 (QAIRT / SDK 2.25). The API is source-compatible only, not
 * ABI-stable, so every size and offset that crosses into a backend library is checked below
 * against the numbers recorded for that version on LP64 (x86-64 and aarch64):
 * Qnn_Tensor_t 144 B, Qnn_OpConfig_t 80 B, Qnn_Param_t 160 B, Qnn_MemDescriptor_t 48 B,
 * the function table at offset 40 of QnnInterface_t, 62 table slots, 536 B in all.
 *
 * The emulator (emu/) implements the same declarations, so both sides of the boundary are
 * checked by the same asserts.
 */
#ifndef XPU_QNN_API_H
#define XPU_QNN_API_H

#include <stddef.h>
#include <stdint.h>

#define QNN_API_MAJOR_PINNED 2u
#define QNN_API_MINOR_PINNED 18u

/* The HTP op configurations newer than the pinned SDK (2.25), by the core API version that
 * certainly carries them (QNN's "HTP Op Def Supplement" revision history dates them by SDK; the
 * QNN API revision history pairs API 2.33 with SDK 2.44, API 2.18 with SDK 2.25, and an SDK's API
 * minor trails its own by 7 to 11, so API 2.32 is the first that is surely SDK 2.39 or later).
 * A backend reporting less gets the 2.25 profile: both the plugin and the emulator lower
 * their rules for the version found.
 *   SDK 2.39: Quantize from FLOAT_32 (before: FLOAT_16), Dequantize to FLOAT_16, 16-bit signed
 *             (SFIXED_POINT_16) outputs op by op: MatMul of 8-bit operands, Dequantize of them
 *   SDK 2.44: ElementWiseDivide on SFIXED_POINT_8 */
#define QNN_API_MINOR_SDK_2_39 32u
#define QNN_API_MINOR_SDK_2_44 33u

typedef uint64_t Qnn_ErrorHandle_t; /* 0 = success */
#define QNN_SUCCESS 0u

/* error codes, as QnnCommon.h / QnnGraph.h / QnnMem.h number them (the component ranges start
 * at QNN_MIN_ERROR_COMMON 1000, _GRAPH 6000, _MEM 8000). Only the low 16 bits are the code
 * (QNN_GET_ERROR_CODE); anything else nonzero is a failure whose text comes from
 * errorGetMessage. */
#define QNN_GET_ERROR_CODE(e) ((e) & 0xFFFFu)
#define QNN_COMMON_ERROR_NOT_SUPPORTED 1000u
#define QNN_COMMON_ERROR_MEM_ALLOC 1002u
#define QNN_COMMON_ERROR_SYSTEM 1003u
#define QNN_COMMON_ERROR_INVALID_ARGUMENT 1004u
#define QNN_COMMON_ERROR_OPERATION_NOT_PERMITTED 1005u
#define QNN_COMMON_ERROR_GENERAL 1100u
#define QNN_GRAPH_ERROR_UNSUPPORTED_FEATURE QNN_COMMON_ERROR_NOT_SUPPORTED
#define QNN_GRAPH_ERROR_INVALID_ARGUMENT 6000u
#define QNN_GRAPH_ERROR_INVALID_HANDLE 6001u
#define QNN_GRAPH_ERROR_INVALID_TENSOR 6004u
#define QNN_GRAPH_ERROR_INVALID_OP_CONFIG 6005u
#define QNN_GRAPH_ERROR_UNCONNECTED_NODE 6007u
#define QNN_GRAPH_ERROR_CREATE_FAILED 6020u
#define QNN_GRAPH_ERROR_FINALIZE_FAILED 6022u
#define QNN_GRAPH_ERROR_GRAPH_NOT_FINALIZED 6023u
#define QNN_GRAPH_ERROR_GRAPH_FINALIZED 6024u
#define QNN_MEM_ERROR_INVALID_ARGUMENT 8000u
#define QNN_MEM_ERROR_MAPPING 8003u
#define QNN_MEM_ERROR_UNSUPPORTED_MEMTYPE 8005u

typedef void *Qnn_BackendHandle_t;
typedef void *Qnn_DeviceHandle_t;
typedef void *Qnn_ContextHandle_t;
typedef void *Qnn_GraphHandle_t;
typedef void *Qnn_LogHandle_t;
typedef void *Qnn_ProfileHandle_t;
typedef void *Qnn_SignalHandle_t;
typedef void *Qnn_MemHandle_t;

typedef struct {
  uint32_t major;
  uint32_t minor;
  uint32_t patch;
} Qnn_Version_t;

typedef struct {
  Qnn_Version_t coreApiVersion;
  Qnn_Version_t backendApiVersion;
} Qnn_ApiVersion_t;

/* backend ids (Qnn<Backend>Common pages) */
#define QNN_BACKEND_ID_CPU 3u
#define QNN_BACKEND_ID_GPU 4u
#define QNN_BACKEND_ID_HTP 6u
/* not a Qualcomm id: the emulator's own, outside the range Qualcomm uses */
#define QNN_BACKEND_ID_XPU_EMU 0x58505545u /* "XPUE" */

/* data types: high byte = class, low byte = bits written in decimal digits */
typedef enum {
  QNN_DATATYPE_INT_8 = 0x0008,
  QNN_DATATYPE_INT_16 = 0x0016,
  QNN_DATATYPE_INT_32 = 0x0032,
  QNN_DATATYPE_INT_64 = 0x0064,
  QNN_DATATYPE_UINT_8 = 0x0108,
  QNN_DATATYPE_UINT_16 = 0x0116,
  QNN_DATATYPE_UINT_32 = 0x0132,
  QNN_DATATYPE_UINT_64 = 0x0164,
  QNN_DATATYPE_FLOAT_16 = 0x0216,
  QNN_DATATYPE_FLOAT_32 = 0x0232,
  QNN_DATATYPE_FLOAT_64 = 0x0264,
  QNN_DATATYPE_SFIXED_POINT_8 = 0x0308,
  QNN_DATATYPE_SFIXED_POINT_16 = 0x0316,
  QNN_DATATYPE_SFIXED_POINT_32 = 0x0332,
  QNN_DATATYPE_UFIXED_POINT_8 = 0x0408,
  QNN_DATATYPE_UFIXED_POINT_16 = 0x0416,
  QNN_DATATYPE_UFIXED_POINT_32 = 0x0432,
  QNN_DATATYPE_BOOL_8 = 0x0508,
  QNN_DATATYPE_STRING = 0x0608,
  QNN_DATATYPE_UNDEFINED = 0x7FFFFFFF,
} Qnn_DataType_t;

typedef enum {
  QNN_TENSOR_TYPE_APP_WRITE = 0,
  QNN_TENSOR_TYPE_APP_READ = 1,
  QNN_TENSOR_TYPE_APP_READWRITE = 2,
  QNN_TENSOR_TYPE_NATIVE = 3,
  QNN_TENSOR_TYPE_STATIC = 4,
  QNN_TENSOR_TYPE_NULL = 5,
  QNN_TENSOR_TYPE_UNDEFINED = 0x7FFFFFFF,
} Qnn_TensorType_t;

typedef enum {
  QNN_TENSOR_DATA_FORMAT_DENSE = 0,
  QNN_TENSOR_DATA_FORMAT_SPARSE = 1,
  QNN_TENSOR_DATA_FORMAT_CODEBOOK = 2,
} Qnn_TensorDataFormat_t;

typedef enum {
  QNN_TENSORMEMTYPE_RAW = 0,
  QNN_TENSORMEMTYPE_MEMHANDLE = 1,
  QNN_TENSORMEMTYPE_UNDEFINED = 0x7FFFFFFF,
} Qnn_TensorMemType_t;

typedef enum {
  QNN_DEFINITION_DEFINED = 1,
  QNN_DEFINITION_IMPLEMENTATION_DEFINED = 0x7FFFFFFE,
  QNN_DEFINITION_UNDEFINED = 0x7FFFFFFF,
} Qnn_Definition_t;

typedef enum {
  QNN_QUANTIZATION_ENCODING_SCALE_OFFSET = 0,
  QNN_QUANTIZATION_ENCODING_AXIS_SCALE_OFFSET = 1,
  QNN_QUANTIZATION_ENCODING_BW_SCALE_OFFSET = 2,
  QNN_QUANTIZATION_ENCODING_BW_AXIS_SCALE_OFFSET = 3,
  QNN_QUANTIZATION_ENCODING_UNDEFINED = 0x7FFFFFFF,
} Qnn_QuantizationEncoding_t;

/* real value = scale * (quantized + offset) */
typedef struct {
  float scale;
  int32_t offset;
} Qnn_ScaleOffset_t;

typedef struct {
  int32_t axis;
  uint32_t numScaleOffsets;
  Qnn_ScaleOffset_t *scaleOffset;
} Qnn_AxisScaleOffset_t;

typedef struct {
  uint32_t bitwidth;
  int32_t axis;
  uint32_t numElements;
  float *scales;
  int32_t *offsets;
} Qnn_BwAxisScaleOffset_t;

typedef struct {
  Qnn_Definition_t encodingDefinition;
  Qnn_QuantizationEncoding_t quantizationEncoding;
  union {
    Qnn_ScaleOffset_t scaleOffsetEncoding;
    Qnn_AxisScaleOffset_t axisScaleOffsetEncoding;
    Qnn_BwAxisScaleOffset_t bwAxisScaleOffsetEncoding; /* the widest member: 32 B */
  };
} Qnn_QuantizeParams_t;

typedef struct {
  void *data;
  uint32_t dataSize;
} Qnn_ClientBuffer_t;

typedef struct {
  uint32_t type;
  uint32_t numSpecifiedElements;
  uint32_t numSparseDimensions;
} Qnn_SparseParams_t;

typedef enum {
  QNN_TENSOR_VERSION_1 = 1,
  QNN_TENSOR_VERSION_2 = 2,
} Qnn_TensorVersion_t;

typedef struct {
  uint32_t id; /* assigned by the backend at tensor creation */
  const char *name;
  Qnn_TensorType_t type;
  Qnn_TensorDataFormat_t dataFormat;
  Qnn_DataType_t dataType;
  Qnn_QuantizeParams_t quantizeParams;
  uint32_t rank;
  uint32_t *dimensions;
  Qnn_TensorMemType_t memType;
  union {
    Qnn_ClientBuffer_t clientBuf;
    Qnn_MemHandle_t memHandle;
  };
} Qnn_TensorV1_t;

typedef struct {
  uint32_t id;
  const char *name;
  Qnn_TensorType_t type;
  Qnn_TensorDataFormat_t dataFormat;
  Qnn_DataType_t dataType;
  Qnn_QuantizeParams_t quantizeParams;
  uint32_t rank;
  uint32_t *dimensions;
  Qnn_TensorMemType_t memType;
  union {
    Qnn_ClientBuffer_t clientBuf;
    Qnn_MemHandle_t memHandle;
  };
  uint8_t *isDynamicDimensions; /* NULL: every dimension static (what xpu always sends) */
  Qnn_SparseParams_t sparseParams;
  uint8_t isProduced;
} Qnn_TensorV2_t;

typedef struct {
  Qnn_TensorVersion_t version;
  union {
    Qnn_TensorV1_t v1;
    Qnn_TensorV2_t v2;
  };
} Qnn_Tensor_t;

typedef struct {
  Qnn_DataType_t dataType;
  union {
    float floatValue;
    double doubleValue;
    uint32_t uint32Value;
    int32_t int32Value;
    uint16_t uint16Value;
    int16_t int16Value;
    uint8_t uint8Value;
    int8_t int8Value;
    uint8_t bool8Value;
    const char *stringValue;
  };
} Qnn_Scalar_t;

typedef enum {
  QNN_PARAMTYPE_SCALAR = 0,
  QNN_PARAMTYPE_TENSOR = 1,
} Qnn_ParamType_t;

typedef struct {
  Qnn_ParamType_t paramType;
  const char *name;
  union {
    Qnn_Scalar_t scalarParam;
    Qnn_Tensor_t tensorParam;
  };
} Qnn_Param_t;

typedef enum {
  QNN_OPCONFIG_VERSION_1 = 1,
} Qnn_OpConfigVersion_t;

typedef struct {
  const char *name;
  const char *packageName; /* "qti.aisw" for the built-in ops */
  const char *typeName;
  uint32_t numOfParams;
  Qnn_Param_t *params;
  uint32_t numOfInputs;
  Qnn_Tensor_t *inputTensors;
  uint32_t numOfOutputs;
  Qnn_Tensor_t *outputTensors;
} Qnn_OpConfigV1_t;

typedef struct {
  Qnn_OpConfigVersion_t version;
  union {
    Qnn_OpConfigV1_t v1;
  };
} Qnn_OpConfig_t;

#define QNN_OP_PACKAGE_NAME_QTI_AISW "qti.aisw"

/* QnnMem: fd-backed memory registered with a context */
typedef enum {
  QNN_MEM_TYPE_ION = 1,
  QNN_MEM_TYPE_CUSTOM = 2,
  QNN_MEM_TYPE_DMA_BUF = 3,
} Qnn_MemType_t;

typedef struct {
  uint32_t numDim;
  uint32_t *dimSize;
  const char *shapeConfig;
} Qnn_MemShape_t;

typedef struct {
  Qnn_MemShape_t memShape;
  Qnn_DataType_t dataType;
  Qnn_MemType_t memType;
  union {
    struct {
      int32_t fd;
    } ionInfo;
    void *customInfo;
    struct {
      int32_t fd;
      void *data;
    } dmaBufInfo;
  };
} Qnn_MemDescriptor_t;

typedef enum {
  QNN_LOG_LEVEL_ERROR = 1,
  QNN_LOG_LEVEL_WARN = 2,
  QNN_LOG_LEVEL_INFO = 3,
  QNN_LOG_LEVEL_VERBOSE = 4,
  QNN_LOG_LEVEL_DEBUG = 5,
} QnnLog_Level_t;

typedef uint64_t Qnn_ContextBinarySize_t;

/* config arrays are NULL-terminated arrays of pointers. xpu passes NULL for backend, device
 * and context configs (defaults) and, on the HTP, one custom graph config list (below). */
typedef void QnnBackend_Config_t;
typedef void QnnDevice_Config_t;
typedef void QnnContext_Config_t;

/* QnnGraph.h: a graph config is an option and a pointer-sized union */
typedef enum {
  QNN_GRAPH_CONFIG_OPTION_CUSTOM = 0,
  QNN_GRAPH_CONFIG_OPTION_PRIORITY = 3,
  QNN_GRAPH_CONFIG_OPTION_UNDEFINED = 0x7FFFFFFF,
} QnnGraph_ConfigOption_t;

typedef struct {
  QnnGraph_ConfigOption_t option;
  union {
    void *customConfig; /* CUSTOM: a backend's own struct (QnnHtpGraph_CustomConfig_t on the HTP) */
    uint32_t priority;
    void *profileHandle;
    uint32_t profilingState;
    uint32_t numProfilingExecutions;
  };
} QnnGraph_Config_t;

/* QnnTypes.h */
typedef enum {
  QNN_PRECISION_FLOAT32 = 0,
  QNN_PRECISION_FLOAT16 = 1,
  QNN_PRECISION_UNDEFINED = 0x7FFFFFFF,
} Qnn_Precision_t;

/* QnnHtpGraph.h: the HTP's custom graph options. Below SDK 2.35 an HTP graph without
 * PRECISION = FLOAT16 is treated as quantized, and FLOAT32 precision is not supported. */
typedef enum {
  QNN_HTP_GRAPH_CONFIG_OPTION_OPTIMIZATION = 1,
  QNN_HTP_GRAPH_CONFIG_OPTION_PRECISION = 2,
  QNN_HTP_GRAPH_CONFIG_OPTION_VTCM_SIZE_IN_MB = 3,
  QNN_HTP_GRAPH_CONFIG_OPTION_FOLD_RELU_ACTIVATION_INTO_CONV_OFF = 4,
  QNN_HTP_GRAPH_CONFIG_OPTION_SHORT_DEPTH_CONV_ON_HMX_OFF = 5,
  QNN_HTP_GRAPH_CONFIG_OPTION_NUM_HVX_THREADS = 6,
  QNN_HTP_GRAPH_CONFIG_OPTION_UNKNOWN = 0x7FFFFFFF,
} QnnHtpGraph_ConfigOption_t;

/* OPTIMIZATION type 3 (finalize optimization flag): 1 fast prepare .. 3 most optimized */
#define QNN_HTP_GRAPH_OPTIMIZATION_TYPE_FINALIZE_OPTIMIZATION_FLAG 3

typedef struct {
  QnnHtpGraph_ConfigOption_t option;
  union {
    struct {
      uint32_t type;
      float floatValue;
    } optimizationOption;
    Qnn_Precision_t precision;
    uint32_t vtcmSizeInMB; /* 0 = QNN_HTP_GRAPH_CONFIG_OPTION_MAX: all the VTCM there is */
    uint8_t foldReluActivationIntoConvOff;
    uint8_t shortDepthConvOnHmxOff;
    uint64_t numHvxThreads;
    void *reserved;
  };
} QnnHtpGraph_CustomConfig_t;

/* QnnHtpMem.h: QNN_MEM_TYPE_CUSTOM on the HTP, one rpcmem fd shared by many tensors, each
 * registration naming its byte offset */
typedef enum {
  QNN_HTP_MEM_QURT = 0,
  QNN_HTP_MEM_SHARED_BUFFER = 1,
  QNN_HTP_MEM_UNDEFINED = 0x7FFFFFFF,
} QnnHtpMem_Type_t;

typedef struct {
  QnnHtpMem_Type_t type;
  uint64_t size; /* the whole shared buffer */
  union {
    uint32_t qurtAddress;
    struct {
      int32_t fd;
      uint64_t offset;
    } sharedBufferConfig;
  };
} QnnMemHtp_Descriptor_t;

/* QnnHtpPerfInfrastructure.h / QnnHtpDevice.h: the HTP's power votes. deviceGetInfrastructure
 * hands out a pointer to the backend's infrastructure struct; on the HTP its perf part creates a
 * power-config id per (device, core) and sets DCVS v3 votes and FastRPC latency/polling on it. */
typedef enum {
  DCVS_VOLTAGE_CORNER_DISABLE = 0x10,
  DCVS_VOLTAGE_VCORNER_MIN_VOLTAGE_CORNER = 0x20,
  DCVS_VOLTAGE_VCORNER_SVS2 = 0x30,
  DCVS_VOLTAGE_VCORNER_SVS = 0x40,
  DCVS_VOLTAGE_VCORNER_SVS_PLUS = 0x50,
  DCVS_VOLTAGE_VCORNER_NOM = 0x60,
  DCVS_VOLTAGE_VCORNER_NOM_PLUS = 0x70,
  DCVS_VOLTAGE_VCORNER_TURBO = 0x80,
  DCVS_VOLTAGE_VCORNER_TURBO_PLUS = 0x90,
  DCVS_VOLTAGE_VCORNER_MAX_VOLTAGE_CORNER = 0xA0,
  DCVS_VOLTAGE_VCORNER_UNKNOWN = 0x7fffffff,
} QnnHtpPerfInfrastructure_VoltageCorner_t;

typedef enum {
  QNN_HTP_PERF_INFRASTRUCTURE_POWERMODE_ADJUST_UP_DOWN = 0x1,
  QNN_HTP_PERF_INFRASTRUCTURE_POWERMODE_POWER_SAVER_MODE = 0x4,
  QNN_HTP_PERF_INFRASTRUCTURE_POWERMODE_PERFORMANCE_MODE = 0x10,
  QNN_HTP_PERF_INFRASTRUCTURE_POWERMODE_UNKNOWN = 0x7fffffff,
} QnnHtpPerfInfrastructure_PowerMode_t;

typedef struct {
  uint32_t contextId; /* the power-config id */
  uint32_t setDcvsEnable, dcvsEnable;
  QnnHtpPerfInfrastructure_PowerMode_t powerMode;
  uint32_t setSleepLatency, sleepLatency; /* microseconds */
  uint32_t setSleepDisable, sleepDisable;
  uint32_t setBusParams;
  QnnHtpPerfInfrastructure_VoltageCorner_t busVoltageCornerMin, busVoltageCornerTarget, busVoltageCornerMax;
  uint32_t setCoreParams;
  QnnHtpPerfInfrastructure_VoltageCorner_t coreVoltageCornerMin, coreVoltageCornerTarget, coreVoltageCornerMax;
} QnnHtpPerfInfrastructure_DcvsV3_t;

typedef enum {
  QNN_HTP_PERF_INFRASTRUCTURE_POWER_CONFIGOPTION_DCVS_V3 = 1,
  QNN_HTP_PERF_INFRASTRUCTURE_POWER_CONFIGOPTION_RPC_CONTROL_LATENCY = 2,
  QNN_HTP_PERF_INFRASTRUCTURE_POWER_CONFIGOPTION_RPC_POLLING_TIME = 3,
  QNN_HTP_PERF_INFRASTRUCTURE_POWER_CONFIGOPTION_UNKNOWN = 0x7fffffff,
} QnnHtpPerfInfrastructure_PowerConfigOption_t;

typedef struct {
  QnnHtpPerfInfrastructure_PowerConfigOption_t option;
  union {
    QnnHtpPerfInfrastructure_DcvsV3_t dcvsV3Config;
    uint32_t rpcControlLatencyConfig; /* microseconds */
    uint32_t rpcPollingTimeConfig;    /* microseconds */
    uint32_t hmxTimeoutIntervalUsConfig;
    uint32_t hmxV2Config[5]; /* QnnHtpPerfInfrastructure_HmxV2_t: not used by xpu */
  };
} QnnHtpPerfInfrastructure_PowerConfig_t;

typedef struct {
  Qnn_ErrorHandle_t (*createPowerConfigId)(uint32_t deviceId, uint32_t coreId, uint32_t *powerConfigId);
  Qnn_ErrorHandle_t (*destroyPowerConfigId)(uint32_t powerConfigId);
  Qnn_ErrorHandle_t (*setPowerConfig)(uint32_t powerConfigId, const QnnHtpPerfInfrastructure_PowerConfig_t **config);
  void (*setMemoryConfig)(void); /* not used by xpu */
} QnnHtpDevice_PerfInfrastructure_t;

#define QNN_HTP_DEVICE_INFRASTRUCTURE_TYPE_PERF 0u

typedef struct {
  uint32_t infraType; /* QNN_HTP_DEVICE_INFRASTRUCTURE_TYPE_PERF */
  union {
    QnnHtpDevice_PerfInfrastructure_t perfInfra;
  };
} QnnHtpDevice_Infrastructure_t;

/* the function table (QNN_INTERFACE_VER_TYPE) for core API 2.18; xpu calls only the typed
 * entries, the others are kept as opaque slots so every later offset stays right */
typedef void (*QnnFn_t)(void);

typedef struct {
  QnnFn_t propertyHasCapability; /* 0 */
  Qnn_ErrorHandle_t (*backendCreate)(Qnn_LogHandle_t logger, const QnnBackend_Config_t **config,
                                     Qnn_BackendHandle_t *backend);
  QnnFn_t backendSetConfig;
  Qnn_ErrorHandle_t (*backendGetApiVersion)(Qnn_ApiVersion_t *version);
  Qnn_ErrorHandle_t (*backendGetBuildId)(const char **id);
  QnnFn_t backendRegisterOpPackage;
  QnnFn_t backendGetSupportedOperations;
  Qnn_ErrorHandle_t (*backendValidateOpConfig)(Qnn_BackendHandle_t backend, Qnn_OpConfig_t op);
  Qnn_ErrorHandle_t (*backendFree)(Qnn_BackendHandle_t backend); /* 8 */
  Qnn_ErrorHandle_t (*contextCreate)(Qnn_BackendHandle_t backend, Qnn_DeviceHandle_t device,
                                     const QnnContext_Config_t **config,
                                     Qnn_ContextHandle_t *context); /* 9 */
  QnnFn_t contextSetConfig;
  Qnn_ErrorHandle_t (*contextGetBinarySize)(Qnn_ContextHandle_t context,
                                            Qnn_ContextBinarySize_t *size);
  Qnn_ErrorHandle_t (*contextGetBinary)(Qnn_ContextHandle_t context, void *buf,
                                        Qnn_ContextBinarySize_t size,
                                        Qnn_ContextBinarySize_t *written);
  Qnn_ErrorHandle_t (*contextCreateFromBinary)(Qnn_BackendHandle_t backend,
                                               Qnn_DeviceHandle_t device,
                                               const QnnContext_Config_t **config,
                                               const void *buf, Qnn_ContextBinarySize_t size,
                                               Qnn_ContextHandle_t *context,
                                               Qnn_ProfileHandle_t profile);
  Qnn_ErrorHandle_t (*contextFree)(Qnn_ContextHandle_t context,
                                   Qnn_ProfileHandle_t profile); /* 14 */
  Qnn_ErrorHandle_t (*graphCreate)(Qnn_ContextHandle_t context, const char *name,
                                   const QnnGraph_Config_t **config,
                                   Qnn_GraphHandle_t *graph); /* 15 */
  QnnFn_t graphCreateSubgraph;
  QnnFn_t graphSetConfig;
  Qnn_ErrorHandle_t (*graphAddNode)(Qnn_GraphHandle_t graph, Qnn_OpConfig_t op); /* 18 */
  Qnn_ErrorHandle_t (*graphFinalize)(Qnn_GraphHandle_t graph, Qnn_ProfileHandle_t profile,
                                     Qnn_SignalHandle_t signal);
  Qnn_ErrorHandle_t (*graphRetrieve)(Qnn_ContextHandle_t context, const char *name,
                                     Qnn_GraphHandle_t *graph);
  Qnn_ErrorHandle_t (*graphExecute)(Qnn_GraphHandle_t graph, const Qnn_Tensor_t *inputs,
                                    uint32_t numInputs, Qnn_Tensor_t *outputs,
                                    uint32_t numOutputs, Qnn_ProfileHandle_t profile,
                                    Qnn_SignalHandle_t signal); /* 21 */
  QnnFn_t graphExecuteAsync;
  QnnFn_t tensorCreateContextTensor;
  Qnn_ErrorHandle_t (*tensorCreateGraphTensor)(Qnn_GraphHandle_t graph,
                                               Qnn_Tensor_t *tensor); /* 24 */
  Qnn_ErrorHandle_t (*logCreate)(void *callback, QnnLog_Level_t maxLevel,
                                 Qnn_LogHandle_t *logger); /* 25 */
  QnnFn_t logSetLogLevel;
  Qnn_ErrorHandle_t (*logFree)(Qnn_LogHandle_t logger); /* 27 */
  QnnFn_t profileCreate;
  QnnFn_t profileSetConfig;
  QnnFn_t profileGetEvents;
  QnnFn_t profileGetSubEvents;
  QnnFn_t profileGetEventData;
  QnnFn_t profileGetExtendedEventData;
  QnnFn_t profileFree; /* 34 */
  Qnn_ErrorHandle_t (*memRegister)(Qnn_ContextHandle_t context, const Qnn_MemDescriptor_t *descs,
                                   uint32_t n, Qnn_MemHandle_t *handles); /* 35 */
  Qnn_ErrorHandle_t (*memDeRegister)(const Qnn_MemHandle_t *handles, uint32_t n); /* 36 */
  QnnFn_t deviceGetPlatformInfo;
  QnnFn_t deviceFreePlatformInfo;
  /* writes a pointer to the backend's infrastructure (QnnHtpDevice_Infrastructure_t on the HTP) */
  Qnn_ErrorHandle_t (*deviceGetInfrastructure)(const QnnHtpDevice_Infrastructure_t **infra); /* 39 */
  Qnn_ErrorHandle_t (*deviceCreate)(Qnn_LogHandle_t logger, const QnnDevice_Config_t **config,
                                    Qnn_DeviceHandle_t *device); /* 40 */
  QnnFn_t deviceSetConfig;
  QnnFn_t deviceGetInfo;
  Qnn_ErrorHandle_t (*deviceFree)(Qnn_DeviceHandle_t device); /* 43 */
  QnnFn_t signalCreate;
  QnnFn_t signalSetConfig;
  QnnFn_t signalTrigger;
  QnnFn_t signalFree; /* 47 */
  Qnn_ErrorHandle_t (*errorGetMessage)(Qnn_ErrorHandle_t error, const char **message); /* 48 */
  QnnFn_t errorGetVerboseMessage;
  QnnFn_t errorFreeVerboseMessage;
  QnnFn_t graphPrepareExecutionEnvironment;
  QnnFn_t graphReleaseExecutionEnvironment;
  QnnFn_t graphGetProperty;
  QnnFn_t contextValidateBinary;
  QnnFn_t contextCreateFromBinaryWithSignal;
  QnnFn_t later[6]; /* 56..61: entries added by 2.18 that xpu does not call */
} QnnInterfaceTable_t;

typedef struct {
  uint32_t backendId;
  const char *providerName;
  Qnn_ApiVersion_t apiVersion;
  union {
    QnnInterfaceTable_t v2_18;
  };
} QnnInterface_t;

/* the one exported symbol of a QNN backend library */
typedef Qnn_ErrorHandle_t (*QnnInterfaceGetProvidersFn_t)(const QnnInterface_t ***providers,
                                                          uint32_t *numProviders);
#define QNN_GET_PROVIDERS_SYMBOL "QnnInterface_getProviders"

/* the recorded layout of API 2.18 on LP64: a mismatch here means the declarations drifted */
#if UINTPTR_MAX == 0xFFFFFFFFFFFFFFFFu
_Static_assert(sizeof(Qnn_QuantizeParams_t) == 40, "Qnn_QuantizeParams_t is 40 B");
_Static_assert(sizeof(Qnn_TensorV1_t) == 112, "Qnn_TensorV1_t is 112 B");
_Static_assert(sizeof(Qnn_TensorV2_t) == 136, "Qnn_TensorV2_t is 136 B");
_Static_assert(offsetof(Qnn_TensorV2_t, quantizeParams) == 32, "quantizeParams at 32");
_Static_assert(offsetof(Qnn_TensorV2_t, rank) == 72, "rank at 72");
_Static_assert(offsetof(Qnn_TensorV2_t, dimensions) == 80, "dimensions at 80");
_Static_assert(offsetof(Qnn_TensorV2_t, memType) == 88, "memType at 88");
_Static_assert(offsetof(Qnn_TensorV2_t, clientBuf) == 96, "memory union at 96");
_Static_assert(offsetof(Qnn_TensorV2_t, isDynamicDimensions) == 112, "isDynamicDimensions at 112");
_Static_assert(offsetof(Qnn_TensorV2_t, sparseParams) == 120, "sparseParams at 120");
_Static_assert(offsetof(Qnn_TensorV2_t, isProduced) == 132, "isProduced at 132");
_Static_assert(sizeof(Qnn_Tensor_t) == 144, "Qnn_Tensor_t is 144 B");
_Static_assert(offsetof(Qnn_Tensor_t, v1) == 8, "tensor union at 8");
_Static_assert(sizeof(Qnn_Param_t) == 160, "Qnn_Param_t is 160 B");
_Static_assert(sizeof(Qnn_OpConfig_t) == 80, "Qnn_OpConfig_t is 80 B");
_Static_assert(sizeof(Qnn_MemDescriptor_t) == 48, "Qnn_MemDescriptor_t is 48 B");
_Static_assert(offsetof(QnnInterface_t, v2_18) == 40, "function table at 40");
_Static_assert(sizeof(QnnInterfaceTable_t) == 62 * sizeof(void *), "62 table slots");
_Static_assert(sizeof(QnnInterface_t) == 536, "QnnInterface_t is 536 B");
_Static_assert(offsetof(QnnInterfaceTable_t, graphAddNode) == 18 * 8, "graphAddNode slot 18");
_Static_assert(offsetof(QnnInterfaceTable_t, graphExecute) == 21 * 8, "graphExecute slot 21");
_Static_assert(offsetof(QnnInterfaceTable_t, tensorCreateGraphTensor) == 24 * 8, "slot 24");
_Static_assert(offsetof(QnnInterfaceTable_t, memRegister) == 35 * 8, "memRegister slot 35");
_Static_assert(offsetof(QnnInterfaceTable_t, deviceCreate) == 40 * 8, "deviceCreate slot 40");
_Static_assert(offsetof(QnnInterfaceTable_t, errorGetMessage) == 48 * 8, "errorGetMessage 48");
_Static_assert(sizeof(QnnGraph_Config_t) == 16, "QnnGraph_Config_t is 16 B, union at 8");
_Static_assert(sizeof(QnnHtpGraph_CustomConfig_t) == 16, "QnnHtpGraph_CustomConfig_t is 16 B, union at 8");
_Static_assert(offsetof(QnnHtpGraph_CustomConfig_t, precision) == 8, "HTP custom config union at 8");
_Static_assert(sizeof(QnnMemHtp_Descriptor_t) == 32, "QnnMemHtp_Descriptor_t is 32 B");
_Static_assert(sizeof(QnnHtpPerfInfrastructure_DcvsV3_t) == 64, "DcvsV3 is 64 B");
_Static_assert(sizeof(QnnHtpPerfInfrastructure_PowerConfig_t) == 68, "PowerConfig is 68 B, union at 4");
_Static_assert(offsetof(QnnHtpDevice_Infrastructure_t, perfInfra.setPowerConfig) == 24, "setPowerConfig at 24");
_Static_assert(offsetof(QnnInterfaceTable_t, deviceGetInfrastructure) == 39 * 8, "deviceGetInfrastructure 39");
_Static_assert(offsetof(QnnMemHtp_Descriptor_t, sharedBufferConfig.offset) == 24, "shared buffer offset at 24");
#endif

/* dtype helpers shared by the plugin and the emulator */
static inline uint32_t qnn_dtype_bytes(Qnn_DataType_t dt) {
  switch (dt) {
  case QNN_DATATYPE_INT_8: case QNN_DATATYPE_UINT_8: case QNN_DATATYPE_SFIXED_POINT_8:
  case QNN_DATATYPE_UFIXED_POINT_8: case QNN_DATATYPE_BOOL_8: return 1;
  case QNN_DATATYPE_INT_16: case QNN_DATATYPE_UINT_16: case QNN_DATATYPE_FLOAT_16:
  case QNN_DATATYPE_SFIXED_POINT_16: case QNN_DATATYPE_UFIXED_POINT_16: return 2;
  case QNN_DATATYPE_INT_32: case QNN_DATATYPE_UINT_32: case QNN_DATATYPE_FLOAT_32:
  case QNN_DATATYPE_SFIXED_POINT_32: case QNN_DATATYPE_UFIXED_POINT_32: return 4;
  case QNN_DATATYPE_INT_64: case QNN_DATATYPE_UINT_64: case QNN_DATATYPE_FLOAT_64: return 8;
  default: return 0;
  }
}

#endif /* XPU_QNN_API_H */
