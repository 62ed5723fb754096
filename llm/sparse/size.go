package sparse

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/xpuhub/xpu/core"
)

// ParseSize reads a byte count: a number with an optional unit, B, KiB, MiB, GiB (powers of
// 1024) or KB, MB, GB (powers of 1000), case-insensitive ("2GiB", "1.5gb", "4096").
func ParseSize(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	units := []struct {
		suf string
		mul float64
	}{{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"b", 1}}
	mul := 1.0
	for _, u := range units {
		if strings.HasSuffix(t, u.suf) {
			t, mul = strings.TrimSpace(strings.TrimSuffix(t, u.suf)), u.mul
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v < 0 || v*mul >= 1<<62 {
		return 0, fmt.Errorf("sparse: size %q (want e.g. 2GiB, 512MiB, 1.5GB): %w", s, core.ErrInvalidArgument)
	}
	return int64(v * mul), nil
}
