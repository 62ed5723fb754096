package conformance

import (
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/loader"
	"github.com/xpuhub/xpu/loader/hosttest"
)

// buildMutants compiles the project's test plugin (loader/testdata/testplugin.c) once per
// mutation ("" = intact) into a temp folder, in parallel, and returns variant -> plugin path.
func buildMutants(t *testing.T, variants ...string) map[string]string {
	t.Helper()
	cc, err := exec.LookPath("gcc")
	if err != nil || runtime.GOOS != "linux" {
		t.Skip("the mutant plugin needs gcc on linux")
	}
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	dir := t.TempDir()
	out := map[string]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, len(variants))
	for i, v := range variants {
		name := "intact"
		if v != "" {
			name = v
		}
		path := filepath.Join(dir, "libxpu-mutant-"+name+".so")
		args := []string{"-std=c11", "-O1", "-g", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror",
			"-fvisibility=hidden", "-D_GNU_SOURCE", "-I" + filepath.Join(root, "abi"),
			"-I" + filepath.Join(root, "plugins", "common"), "-o", path,
			filepath.Join(root, "loader", "testdata", "testplugin.c"), "-lpthread", "-lm"}
		if v != "" {
			args = append(args, "-D"+v)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if b, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
				errs[i] = &buildError{err: err, out: string(b)}
				return
			}
			mu.Lock()
			out[v] = path
			mu.Unlock()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	return out
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + e.out }

// TestMain lets this test binary serve isolated plugins (see hosttest).
func TestMain(m *testing.M) { hosttest.Main(m) }

func runPlugin(t *testing.T, path string, opts ...Option) *Report {
	t.Helper()
	return runPluginWith(t, path, nil, opts...)
}

func runPluginWith(t *testing.T, path string, lopts []loader.Option, opts ...Option) *Report {
	t.Helper()
	ctx := context.Background()
	b, err := loader.Open(ctx, path, append(lopts, loader.WithoutEnv())...)
	require.NoError(t, err)
	rep, err := Run(ctx, b, opts...)
	require.NoError(t, err)
	require.NoError(t, b.Close())
	return rep
}

// Every mutation must be caught, in its category, and the intact plugin must pass everything
// it does not decline: a suite that passes a broken backend is worse than none.
func TestMutantsAreCaught(t *testing.T) {
	tests := []struct {
		define   string
		filter   string   // the cases of the mutated op
		cat      Category // every failure's category
		mustFail []string
	}{
		{"MUT_TRANSPOSE", `^PERMUTE\(dtype=f32,`, CatMismatch, []string{"PERMUTE(dtype=f32,shape=[2,3],perm=[1,0])"}},
		{"MUT_OFF_BY_ONE_ROW", `^MATMUL\(a=f32,b=f32,`, CatMismatch, []string{"MATMUL(a=f32,b=f32,a_shape=[5,7],b_shape=[3,7],b_const=false)"}},
		{"MUT_WRITE_PAST", `^ADD\(dtype=f32,`, CatOutOfBounds, []string{"ADD(dtype=f32,a=[7],b=[7])"}},
		{"MUT_NAN", `^RELU\(dtype=f32,`, CatNaN, []string{"RELU(dtype=f32,shape=[17])"}},
		{"MUT_REFUSE", `^EXP\(dtype=f32,`, CatCapabilityLie, []string{"EXP(dtype=f32,shape=[7])"}},
		{"MUT_SOFTMAX", `^SOFTMAX\(dtype=f32,`, CatMismatch, []string{"SOFTMAX(dtype=f32,shape=[4,1000],scale=0.125,causal=false,offset=0)"}},
		{"MUT_NONDET", `^ADD\(dtype=f32,`, CatNondeterministic, []string{"ADD(dtype=f32,a=[3,33],b=[3,33])"}},
		{"MUT_STALE_OK", `^ABI\(`, CatError, []string{"ABI(stale-and-foreign-handles)"}},
		{"MUT_SILENT", `^ABI\(`, CatError, []string{"ABI(wrong-bindings)"}},
	}
	variants := []string{""}
	for _, tt := range tests {
		variants = append(variants, tt.define)
	}
	plugins := buildMutants(t, variants...)

	t.Run("intact", func(t *testing.T) {
		rep := runPlugin(t, plugins[""])
		assert.Zero(t, rep.Failed, "failures: %v", rep.Failures())
		passedPerLevel := map[int]int{}
		for _, c := range rep.Cases {
			if c.Status == StatusPass {
				passedPerLevel[c.Level]++
			}
		}
		// level 4 needs ops the mutant does not implement: its graphs are unsupported there
		for level := 1; level <= 3; level++ {
			assert.Positive(t, passedPerLevel[level], "level %d ran nothing on the intact plugin", level)
		}
	})
	for _, tt := range tests {
		t.Run(tt.define, func(t *testing.T) {
			rep := runPlugin(t, plugins[tt.define], WithFilter(regexp.MustCompile(tt.filter)))
			require.NotEmpty(t, rep.Cases)
			assert.Positive(t, rep.Failed, "the mutation went unnoticed")
			for _, c := range rep.Failures() {
				assert.Equal(t, tt.cat, c.Category, "%s: %v", c.Name, c.Errors)
				assert.Contains(t, c.Repro, "xpu conform --plugin ")
			}
			for _, name := range tt.mustFail {
				c, ok := rep.Case(name)
				require.True(t, ok, "case %s not run", name)
				assert.Equal(t, StatusFail, c.Status, name)
			}
		})
	}
}

// A plugin that kills its process is a crash, not the end of the run: isolated, the suite
// records the case, the backend restarts, and the next cases run.
func TestCrashIsCaughtWhenIsolated(t *testing.T) {
	if testing.Short() {
		t.Skip("starts plugin-host child processes: not in -short")
	}
	plugins := buildMutants(t, "MUT_CRASH")
	rep := runPluginWith(t, plugins["MUT_CRASH"], []loader.Option{loader.Isolated()},
		WithFilter(regexp.MustCompile(`^(SCALE\(dtype=f32,shape=\[(7|17)\]\)|ADD\(dtype=f32,a=\[7\],b=\[7\]\))$`)))
	require.Len(t, rep.Cases, 3)
	require.Equal(t, "ADD", rep.Cases[2].Op, "a case after the crashes")
	for _, c := range rep.Cases {
		if c.Op == "SCALE" {
			assert.Equal(t, CatCrash, c.Category, "%s: %v", c.Name, c.Errors)
		} else {
			assert.Equal(t, StatusPass, c.Status, "%s after a crash: %v", c.Name, c.Errors)
		}
	}
	assert.True(t, rep.Backend.Isolated)
}

// A plugin that refuses to release a buffer while any live execution binds it (stricter than
// the ABI) must still pass the buffer cases: the suite releases each execution before the
// buffers bound to it. The suite used to defer them the other way round, and failed it.
func TestSuiteReleasesExecutionsBeforeBuffers(t *testing.T) {
	plugins := buildMutants(t, "TP_STRICT_RELEASE")
	rep := runPlugin(t, plugins["TP_STRICT_RELEASE"], WithFilter(regexp.MustCompile(`^BUFFER\(`)))
	assert.Zero(t, rep.Failed, "failures: %v", rep.Failures())
	for _, name := range []string{"BUFFER(import-host)", "BUFFER(offset-binding,kv-append)", "BUFFER(parallel-executions)"} {
		c, ok := rep.Case(name)
		require.True(t, ok, "case %s not run", name)
		assert.Equal(t, StatusPass, c.Status, "%s: %v", name, c.Errors)
	}
}

// A context the suite cannot close at the end is a failure printed like any case: a FAIL
// line with its errors and a rerun command, counted in the report.
func TestContextCloseAtEndIsPrinted(t *testing.T) {
	plugins := buildMutants(t, "MUT_CTX_LEAK")
	var out strings.Builder
	ctx := context.Background()
	b, err := loader.Open(ctx, plugins["MUT_CTX_LEAK"], loader.WithoutEnv())
	require.NoError(t, err)
	rep, err := Run(ctx, b, WithFilter(regexp.MustCompile(`^RELU\(dtype=f32,shape=\[17\]\)$`)), WithProgress(&out))
	require.NoError(t, err)
	assert.Error(t, b.Close(), "the leaked context keeps the plugin from shutting down")
	c, ok := rep.Case("ABI(context-close-at-end)")
	require.True(t, ok)
	assert.Equal(t, StatusFail, c.Status)
	assert.Equal(t, 1, rep.Failed)
	assert.Contains(t, out.String(), "ABI(context-close-at-end): FAIL [error]")
	assert.Contains(t, out.String(), "rerun: xpu conform --plugin "+plugins["MUT_CTX_LEAK"]+
		` --filter '^RELU\(dtype=f32,shape=\[17\]\)$' --seed 0`)
}

// A hung isolated plugin used to cost every later case its execute timeout (30 s × 41 cases):
// the first timeout is one clear failure and the plugin's remaining cases are skipped.
func TestHungIsolatedPluginIsSkippedAfterOneTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("starts plugin-host child processes: not in -short")
	}
	plugins := buildMutants(t, "MUT_HANG")
	start := time.Now()
	rep := runPluginWith(t, plugins["MUT_HANG"], []loader.Option{loader.Isolated(), loader.WithExecuteTimeout(time.Second)},
		WithFilter(regexp.MustCompile(`^(SCALE\(dtype=f32,shape=\[(7|17)\]\)|ADD\(dtype=f32,a=\[7\],b=\[7\]\))$`)))
	require.Len(t, rep.Cases, 3)
	first := rep.Cases[0]
	assert.Equal(t, "SCALE", first.Op)
	assert.Equal(t, StatusFail, first.Status)
	assert.Equal(t, CatTimeout, first.Category, "%v", first.Errors)
	assert.Contains(t, strings.Join(first.Errors, "\n"), "remaining cases are skipped")
	for _, c := range rep.Cases[1:] {
		assert.Equal(t, StatusSkipped, c.Status, c.Name)
		assert.Contains(t, c.Reason, "timed out in "+first.Name)
	}
	assert.Equal(t, 1, rep.Failed)
	assert.Less(t, time.Since(start), 20*time.Second, "the later cases waited for their own timeouts")
}
