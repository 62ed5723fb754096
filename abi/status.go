package abi

import (
	"fmt"

	"github.com/xpuhub/xpu/core"
)

// Status is an xpu_status code returned by every plugin call.
type Status int32

// Status codes, as XPU_OK and XPU_E_* in xpu_backend.h.
const (
	StatusOK            Status = 0
	StatusUnsupported   Status = -1
	StatusInvalidArg    Status = -2
	StatusInvalidHandle Status = -3
	StatusBadState      Status = -4
	StatusOutOfMemory   Status = -5
	StatusIncompatible  Status = -6
	StatusMissingDep    Status = -7
	StatusDeviceLost    Status = -8
	StatusTimeout       Status = -9
	StatusInternal      Status = -10
)

var statusNames = [...]string{"XPU_OK", "XPU_E_UNSUPPORTED", "XPU_E_INVALID_ARG",
	"XPU_E_INVALID_HANDLE", "XPU_E_BAD_STATE", "XPU_E_OUT_OF_MEMORY", "XPU_E_INCOMPATIBLE",
	"XPU_E_MISSING_DEP", "XPU_E_DEVICE_LOST", "XPU_E_TIMEOUT", "XPU_E_INTERNAL"}

var statusErrors = [...]error{nil, core.ErrUnsupported, core.ErrInvalidArgument,
	core.ErrInvalidHandle, core.ErrBadState, core.ErrOutOfMemory, core.ErrIncompatible,
	core.ErrMissingDependency, core.ErrDeviceLost, core.ErrTimeout, core.ErrInternal}

// String is the C name of the code (XPU_E_INVALID_ARG, ...).
func (s Status) String() string {
	if s <= 0 && int(-s) < len(statusNames) {
		return statusNames[-s]
	}
	return fmt.Sprintf("XPU_E_UNKNOWN(%d)", int32(s))
}

// Sentinel is the core error the code maps to (nil for XPU_OK). Unknown codes are backend bugs
// and map to core.ErrInternal.
func (s Status) Sentinel() error {
	if s <= 0 && int(-s) < len(statusErrors) {
		return statusErrors[-s]
	}
	return core.ErrInternal
}

// Err turns a status into an error that wraps its sentinel (errors.Is(err,
// core.ErrUnsupported)) and carries msg, normally the plugin's last_error text. It returns nil
// for StatusOK.
func (s Status) Err(msg string) error {
	if s == StatusOK {
		return nil
	}
	return &StatusError{Status: s, Msg: msg}
}

// StatusError is a failed plugin call.
type StatusError struct {
	Status Status
	Msg    string
}

// Error names the status, the plugin's message and the sentinel it maps to.
func (e *StatusError) Error() string {
	if e.Msg == "" {
		return fmt.Sprintf("%s (%v)", e.Status, e.Status.Sentinel())
	}
	return fmt.Sprintf("%s: %s (%v)", e.Status, e.Msg, e.Status.Sentinel())
}

// Unwrap gives the sentinel error of core/errors.go.
func (e *StatusError) Unwrap() error { return e.Status.Sentinel() }
