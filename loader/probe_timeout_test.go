package loader

import (
	"bytes"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// XPU_PROBE_TIMEOUT is read with an upper bound: a larger value is clamped with a warning, a bad
// one ignored with a warning.
func TestProbeTimeoutEnv(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  time.Duration // 0: the default applies
		warns string
	}{
		{"2s", 2 * time.Second, ""},
		{"2m", 2 * time.Minute, ""},
		{"1h", MaxProbeTimeout, "above the maximum: clamped"},
		{"100000h", MaxProbeTimeout, "above the maximum: clamped"},
		{"10000000h", 0, "ignoring a bad"}, // past time.Duration
		{"0", 0, "ignoring a bad"},
		{"-1s", 0, "ignoring a bad"},
		{"soon", 0, "ignoring a bad"},
	} {
		t.Run(tc.value, func(t *testing.T) {
			t.Setenv(EnvProbeTimeout, tc.value)
			var log bytes.Buffer
			c := newConfig([]Option{WithLogger(slog.New(slog.NewTextHandler(&log, nil)))})
			assert.Equal(t, tc.want, c.probeTimeout)
			if tc.warns == "" {
				assert.Empty(t, log.String())
			} else {
				assert.Contains(t, log.String(), tc.warns)
				assert.Contains(t, log.String(), "level=WARN")
			}
		})
	}
}
