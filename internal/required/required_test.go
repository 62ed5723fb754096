package required

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestNamesAndMissing(t *testing.T) {
	cases := []struct {
		env     string
		names   []string
		missing []string // of found = neon, qnn
	}{
		{"", nil, nil},
		{" , ", nil, nil},
		{"neon", []string{"neon"}, nil},
		{"neon, opencl ,qnn,neon", []string{"neon", "opencl", "qnn"}, []string{"opencl"}},
	}
	for _, c := range cases {
		t.Run(c.env, func(t *testing.T) {
			t.Setenv(Env, c.env)
			assert.Equal(t, c.names, Names())
			assert.Equal(t, c.missing, Missing([]string{"neon", "qnn"}))
			for _, n := range c.names {
				assert.True(t, Is(n))
			}
			assert.False(t, Is("ref"))
		})
	}
}

// fakeTB records whether Skip skipped or failed.
type fakeTB struct {
	testing.TB
	skipped, failed bool
	msg             string
}

func (f *fakeTB) Helper()                          {}
func (f *fakeTB) Skipf(format string, args ...any) { f.skipped = true }
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed = true
	f.msg = format
}

func TestSkipFailsARequiredBackend(t *testing.T) {
	t.Setenv(Env, "neon,opencl")
	var tb fakeTB
	Skip(&tb, "opencl", "opencl probes 0 here: %s", "no ICD")
	assert.True(t, tb.failed)
	assert.False(t, tb.skipped)
	assert.Contains(t, tb.msg, "is required by")

	tb = fakeTB{}
	Skip(&tb, "qnn", "not built")
	assert.True(t, tb.skipped)
	assert.False(t, tb.failed)
}
