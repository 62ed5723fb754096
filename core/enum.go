package core

import (
	"fmt"
	"strings"
)

// enumName is the name of v in names (indexed by value), or kind(v) for a value past them.
func enumName[T ~uint32](names []string, v T, kind string) string {
	if int(v) < len(names) {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", kind, uint32(v))
}

// parseEnum finds s among names (case-insensitive) but the first, the invalid value's, which is
// what a name that is none of them gives, with ErrNotFound.
func parseEnum[T ~uint32](names []string, s, kind string) (T, error) {
	for i, n := range names[1:] {
		if strings.EqualFold(n, s) {
			return T(i + 1), nil
		}
	}
	return 0, fmt.Errorf("%s %q: %w", kind, s, ErrNotFound)
}
