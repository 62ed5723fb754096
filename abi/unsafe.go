package abi

import "unsafe"

// unsafeBytes views a []uint64 as bytes (for 8-byte aligned buffers).
func unsafeBytes(w []uint64) []byte {
	if len(w) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), len(w)*8)
}
