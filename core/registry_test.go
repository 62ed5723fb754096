package core_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
)

// TestRegistry: built-in backends register once by name (a duplicate, an empty name or a nil
// Open panics, as database/sql.Register does), are found by Lookup and OpenBackend, listed in
// name order, and their settings validated; lookups are safe beside registrations.
func TestRegistry(t *testing.T) {
	opened := 0
	var set []string
	core.Register(core.BuiltIn{
		Name:     "test-registry-b",
		Open:     func(context.Context) (core.Backend, error) { opened++; return ref.New(), nil },
		Settings: []core.Setting{{Key: "mode", Values: []string{"fast", "slow"}}},
		Set:      func(k, v string) error { set = append(set, k+"="+v); return nil },
	})
	core.Register(core.BuiltIn{Name: "test-registry-a", Open: func(context.Context) (core.Backend, error) { return ref.New(), nil }})

	for _, tc := range []struct {
		name string
		b    core.BuiltIn
	}{
		{"duplicate", core.BuiltIn{Name: "test-registry-a", Open: func(context.Context) (core.Backend, error) { return nil, nil }}},
		{"no name", core.BuiltIn{Open: func(context.Context) (core.Backend, error) { return nil, nil }}},
		{"no open", core.BuiltIn{Name: "test-registry-c"}},
	} {
		t.Run(tc.name, func(t *testing.T) { assert.Panics(t, func() { core.Register(tc.b) }) })
	}

	_, ok := core.Lookup("test-registry-c")
	assert.False(t, ok, "a refused registration leaves nothing behind")
	b, ok := core.Lookup(ref.Name)
	require.True(t, ok, "core/ref registers itself")
	assert.Equal(t, ref.Name, b.Name)

	var names []string
	for _, b := range core.BuiltIns() {
		names = append(names, b.Name)
	}
	assert.IsIncreasing(t, names)
	assert.Subset(t, names, []string{ref.Name, "test-registry-a", "test-registry-b"})

	ctx := context.Background()
	be, err := core.OpenBackend(ctx, nil, "test-registry-b")
	require.NoError(t, err)
	require.NoError(t, be.Close())
	assert.Equal(t, 1, opened)

	require.NoError(t, core.SetBackendSetting("test-registry-b", "mode", "slow"))
	assert.ErrorIs(t, core.SetBackendSetting("test-registry-b", "mode", "warp"), core.ErrInvalidArgument)
	assert.ErrorIs(t, core.SetBackendSetting("test-registry-b", "color", "red"), core.ErrNotFound)
	assert.ErrorIs(t, core.SetBackendSetting("test-registry-a", "mode", "fast"), core.ErrNotFound)
	assert.ErrorIs(t, core.SetBackendSetting("no-such", "mode", "fast"), core.ErrNotFound)
	assert.Equal(t, []string{"mode=slow"}, set)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = core.OpenBackend(cancelled, nil, ref.Name)
	assert.ErrorIs(t, err, context.Canceled)

	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				core.Register(core.BuiltIn{Name: fmt.Sprintf("test-registry-concurrent-%d", i),
					Open: func(context.Context) (core.Backend, error) { return ref.New(), nil }})
				return
			}
			_, ok := core.Lookup(ref.Name)
			assert.True(t, ok)
			_ = core.BuiltIns()
		}()
	}
	wg.Wait()
	for i := 0; i < 8; i += 2 {
		_, ok := core.Lookup(fmt.Sprintf("test-registry-concurrent-%d", i))
		assert.True(t, ok)
	}
}

// TestOpenBackendWithoutSource: a name that is not built in, in a program that links no plugin
// loader (core's tests do not), is ErrNotFound saying what to import.
func TestOpenBackendWithoutSource(t *testing.T) {
	require.Nil(t, core.DefaultSource())
	_, err := core.OpenBackend(context.Background(), nil, "neon")
	require.ErrorIs(t, err, core.ErrNotFound)
	assert.Contains(t, err.Error(), "xpu/loader")
}
