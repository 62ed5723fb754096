package core

import "errors"

// Sentinel errors. Backends wrap them with %w so callers can test with errors.Is.
var (
	// ErrUnsupported: the backend cannot run this op, dtype or feature. Not a failure.
	ErrUnsupported = errors.New("unsupported")
	// ErrNotFound: no such backend, device, plugin or tensor.
	ErrNotFound = errors.New("not found")
	// ErrIncompatible: ABI, op-set, IR or cached-artifact version mismatch.
	ErrIncompatible = errors.New("incompatible")
	// ErrInvalidArgument: a bad argument (shape, size, index, null).
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrBadState: lifecycle misuse, such as running before every input is bound.
	ErrBadState = errors.New("bad state")
	// ErrMissingDependency: a vendor library or driver is absent.
	ErrMissingDependency = errors.New("missing dependency")
	// ErrBackendCrashed: an isolated backend's process died.
	ErrBackendCrashed = errors.New("backend crashed")
	// ErrOutOfMemory: an allocation failed.
	ErrOutOfMemory = errors.New("out of memory")
	// ErrTimeout: a wait or a call ran past its deadline.
	ErrTimeout = errors.New("timeout")
	// ErrDeviceLost: the device stopped working.
	ErrDeviceLost = errors.New("device lost")
	// ErrInternal: a backend bug.
	ErrInternal = errors.New("internal error")
	// ErrInvalidHandle: a stale, released or foreign handle.
	ErrInvalidHandle = errors.New("invalid handle")
)
