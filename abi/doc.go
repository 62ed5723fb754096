// Package abi is the Go side of the xpu backend ABI (xpu_backend.h): the graph IR writer, the
// mirror of the C structs, and the purego binding that presents a plugin as a core.Backend.
// It is the only package of xpu that uses unsafe.
package abi
