// Package opencl holds the Go tests of the OpenCL GPU plugin. Its C
// sources build build/plugins/libxpu-opencl*.so, which the loader opens at run time.
package opencl
