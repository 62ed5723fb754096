// Package qnn holds the Go tests of the Qualcomm QNN NPU plugin and its emulated provider. Its C
// sources build build/plugins/libxpu-qnn*.so, which the loader opens at run time.
package qnn
