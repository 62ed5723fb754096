package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/arch"
	"github.com/xpuhub/xpu/llm/quant"
	"github.com/xpuhub/xpu/loader"
)

// llamaCppArchs are the architectures TestLlamaCppArchLogits writes with gen-model and checks in
// llama.cpp. One that gen-model does not write yet is skipped with gen-model's reason, so the
// list can name every architecture llama.cpp and xpu share.
var llamaCppArchs = []string{"llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "llama3", "mistral", "smollm3", "granite"}

// llamaCppPrompt is the token sequence both sides run: BOS and ids spread over the synthetic
// vocabulary (byte tokens and merged pieces). Ids, not text, so the tokenizers are not part of
// the comparison (llm/tokenizer checks those against llama-tokenize).
var llamaCppPrompt = []int32{1, 345, 299, 410, 267, 502, 318, 433}

const (
	llamaCppGreedy = 32 // greedy tokens compared after the prompt
	llamaCppRows   = 16 // logits rows compared: the prompt's 8 and the first 8 generated
)

// llamaCppRun is what scripts/llamacpp/logits.c prints, and the same measured in xpu.
type llamaCppRun struct {
	NVocab int         `json:"n_vocab"`
	Prompt []int32     `json:"prompt"`
	Logits [][]float32 `json:"logits"` // row i: after token i of prompt+tokens
	Tokens []int32     `json:"tokens"` // the greedy continuation
	// Prefill is xpu's logits after the whole prompt run as one prefill (its chunked graphs,
	// where Logits come one decode step at a time); llama.cpp runs the prompt as one batch.
	Prefill []float32 `json:"-"`
	// Config is the model's, as xpu read it (the Q8_0 bound depends on its depth and FFN).
	Config llm.Config `json:"-"`
}

// q8Bound is the logits NMSE a Q8_0 model may show against llama.cpp: the GRAPH tolerance
// for Q8_0 (1e-3, conformance/TOLERANCES.md) per 8 layers, doubled for a GELU FFN. The rows
// differ by rounding alone, and rounding noise grows with depth: llama.cpp re-quantizes every
// matmul's activations to Q8_0, so a difference in the last bit before a matmul can move a
// code by one step, and the next layer carries that on. llama.cpp's CPU GELU reads an fp16
// table (GGML_GELU_FP16), which seeds such a difference at every GELU FFN (1e-7 at the GELU's
// output): with that table emulated, neon's Gemma 2 Q8_0 logits are llama.cpp's to 1e-14, and
// llama.cpp and ik_llama.cpp, run on the same Q8_0 files, disagree by 5.3e-4–6.3e-4 over 8
// layers and by 1.8e-3 over Gemma 2's 26.
func q8Bound(c llm.Config) float64 {
	b := 1e-3 * max(1, float64(c.Layers)/8)
	if c.Activation == arch.ActGELU {
		b *= 2
	}
	return b
}

// llamaCppAgreement is how closely two runs agree: the greedy tokens equal before the first
// difference, and the worst NMSE of the logits rows both sides computed on the same tokens.
type llamaCppAgreement struct {
	Tokens  int     // greedy tokens equal before the first difference
	Rows    int     // logits rows compared
	MaxNMSE float64 // over those rows
}

// compareLlamaCpp measures ours against theirs (llama.cpp, the reference of the NMSE). A row
// after a generated token is compared only while both continuations agree up to it: past a
// difference the two sides condition on different tokens.
func compareLlamaCpp(ours, theirs llamaCppRun) (llamaCppAgreement, error) {
	var a llamaCppAgreement
	if !slices.Equal(ours.Prompt, theirs.Prompt) {
		return a, fmt.Errorf("prompts differ: %v and %v", ours.Prompt, theirs.Prompt)
	}
	if ours.NVocab != theirs.NVocab {
		return a, fmt.Errorf("vocabularies differ: %d and %d tokens", ours.NVocab, theirs.NVocab)
	}
	for a.Tokens < min(len(ours.Tokens), len(theirs.Tokens)) && ours.Tokens[a.Tokens] == theirs.Tokens[a.Tokens] {
		a.Tokens++
	}
	// Row i follows token i; generated token g is token len(prompt)+g.
	rows := min(len(ours.Logits), len(theirs.Logits), len(ours.Prompt)+a.Tokens)
	for i := range rows {
		if len(ours.Logits[i]) != ours.NVocab || len(theirs.Logits[i]) != theirs.NVocab {
			return a, fmt.Errorf("logits row %d has %d and %d values for %d tokens", i, len(ours.Logits[i]), len(theirs.Logits[i]), ours.NVocab)
		}
		a.MaxNMSE = max(a.MaxNMSE, quant.NMSE(ours.Logits[i], theirs.Logits[i]))
	}
	a.Rows = rows
	if rows == 0 {
		return a, errors.New("no logits rows to compare")
	}
	return a, nil
}

// xpuRun runs prompt through model on backend (with the KV cache type llama.cpp ran) and returns the
// same measurements logits.c prints: logits rows one token at a time and the greedy continuation,
// and the logits after the prompt run as one prefill. The error is the backend's refusal of the
// model (core.ErrUnsupported: an op it lacks); anything else fails the test.
func xpuRun(ctx context.Context, t *testing.T, model, backend string, kv core.DType, prompt []int32, greedy, rows int) (llamaCppRun, error) {
	t.Helper()
	e, err := llm.Load(ctx, model, llm.WithBackend(backend), llm.WithRunnerOptions(llm.WithKVCacheType(kv)))
	if errors.Is(err, core.ErrUnsupported) {
		return llamaCppRun{}, err
	}
	require.NoError(t, err)
	defer e.Close()
	run := llamaCppRun{NVocab: e.Model().Config.Vocab, Prompt: prompt, Config: e.Model().Config}
	pre, err := e.Prefill(ctx, prompt)
	require.NoError(t, err, "prefill")
	run.Prefill = append([]float32(nil), pre...)
	e.Reset()
	seq := append([]int32(nil), prompt...)
	for i := 0; i < len(prompt)+greedy; i++ {
		var logits []float32
		if i == 0 {
			logits, err = e.Prefill(ctx, seq[:1])
		} else {
			logits, err = e.Decode(ctx, seq[i])
		}
		require.NoError(t, err, "position %d", i)
		if i < rows {
			run.Logits = append(run.Logits, append([]float32(nil), logits...))
		}
		if i >= len(prompt)-1 && len(run.Tokens) < greedy {
			next := argmax(logits)
			run.Tokens = append(run.Tokens, next)
			seq = append(seq, next)
		}
		if len(run.Tokens) == greedy && i+1 >= rows {
			break
		}
	}
	return run, nil
}

// llamaCppLogits runs scripts/llamacpp/logits.c's binary on model with an f32 KV cache, or f16
// where the build refuses f32 (ik_llama.cpp on the CPU: logits.c exits 3), and returns the
// cache type it ran.
func llamaCppLogits(ctx context.Context, t *testing.T, tool, model string, prompt []int32, greedy, rows int) (llamaCppRun, core.DType) {
	t.Helper()
	ids := make([]string, len(prompt))
	for i, id := range prompt {
		ids[i] = strconv.Itoa(int(id))
	}
	for _, kv := range []core.DType{core.F32, core.F16} {
		cmd := exec.CommandContext(ctx, tool, "-m", model, "-p", strings.Join(ids, ","),
			"-n", strconv.Itoa(greedy), "-k", strconv.Itoa(rows), "--kv", kv.String())
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		var ee *exec.ExitError
		if kv == core.F32 && errors.As(err, &ee) && ee.ExitCode() == 3 {
			t.Logf("llama.cpp refused an f32 KV cache, both sides run f16: %s", strings.TrimSpace(lastLine(stderr.String())))
			continue
		}
		if err != nil && strings.Contains(stderr.String(), "unknown model architecture") {
			// an older llama.cpp (upstream before Qwen3 and Gemma 3): nothing to compare with
			t.Skipf("this llama.cpp lacks the architecture: %s", strings.TrimSpace(stderr.String()))
		}
		require.NoError(t, err, "%s on %s:\n%s", tool, model, stderr.String())
		var run llamaCppRun
		require.NoError(t, json.Unmarshal(out, &run), "%s printed %.200q", tool, out)
		return run, kv
	}
	t.Fatal("unreachable: f16 either ran or failed the test")
	return llamaCppRun{}, 0
}

// Every architecture gen-model writes loads in llama.cpp, and llama.cpp's greedy tokens and
// logits on the 6M preset are xpu's: at F32 weights the 32 greedy tokens agree and every
// compared logits row is within NMSE 1e-4 (the float sums run in different orders, nothing
// else differs); at Q8_0 llama.cpp quantizes the activations of every matmul to Q8_0 blocks
// where the reference does not, so the rows are judged at the GRAPH tolerance for Q8_0 (1e-3,
// conformance/TOLERANCES.md) and the tokens only reported: a random model's logits are
// near-flat, and an 8-bit rounding can swap two candidates. neon is compared too when it is
// built; a model it refuses (an op it lacks) is reported in the table, not failed.
// LLAMACPP_LOGITS is scripts/llamacpp/logits.c built against LLAMA_BIN's llama.h (make
// llamacpp-check builds it).
func TestLlamaCppArchLogits(t *testing.T) {
	llamaBin(t)
	tool := os.Getenv("LLAMACPP_LOGITS")
	if tool == "" {
		t.Skip("LLAMACPP_LOGITS (scripts/llamacpp/logits.c built against LLAMA_BIN's llama.h) is not set: make llamacpp-check LLAMA_BIN=... builds and sets it")
	}
	backends := []string{loader.RefName}
	if b, err := loader.Open(context.Background(), "neon"); err == nil {
		b.Close()
		backends = append(backends, "neon")
	} else {
		t.Logf("neon is not built (make all), only the reference is compared: %v", err)
	}
	types := []struct {
		name    string
		maxNMSE float64 // 0: q8Bound of the model
		tokens  int     // greedy tokens that must agree
	}{
		{"f32", 1e-4, llamaCppGreedy},
		{"q8_0", 0, 0}, // q8Bound of the model
	}
	dir := t.TempDir()
	var table []string
	for _, arch := range llamaCppArchs {
		for _, ty := range types {
			t.Run(arch+"/"+ty.name, func(t *testing.T) {
				model := filepath.Join(dir, arch+"-"+ty.name+".gguf")
				code, _, errOut := runCLI(t, "gen-model", "--arch", arch, "--params", "6M", "--type", ty.name, "-o", model)
				if code != 0 && strings.Contains(errOut, core.ErrUnsupported.Error()) {
					// not a missing backend: gen-model refuses an architecture it cannot write
					t.Skipf("gen-model does not write %s: %s", arch, strings.TrimSpace(errOut))
				}
				require.Equal(t, 0, code, errOut)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				theirs, kv := llamaCppLogits(ctx, t, tool, model, llamaCppPrompt, llamaCppGreedy, llamaCppRows)
				for _, be := range backends {
					ours, err := xpuRun(ctx, t, model, be, kv, llamaCppPrompt, llamaCppGreedy, llamaCppRows)
					if err != nil && be != loader.RefName {
						// The reference runs every op; another backend may lack one (it says
						// which), which is its own conformance's business, not a disagreement
						// with llama.cpp.
						row := fmt.Sprintf("| %s | %s | %s | %s | refused: %v | | | | |", arch, ty.name, kv, be, err)
						table = append(table, row)
						t.Log(row)
						continue
					}
					require.NoError(t, err, "the reference refused %s", model)
					a, err := compareLlamaCpp(ours, theirs)
					require.NoError(t, err)
					prefill := quant.NMSE(ours.Prefill, theirs.Logits[len(llamaCppPrompt)-1])
					bound := ty.maxNMSE
					if bound == 0 {
						bound = q8Bound(ours.Config)
					}
					row := fmt.Sprintf("| %s | %s | %s | %s | %d/%d | %d | %.2e | %.2e | %.1e |", arch, ty.name, kv, be, a.Tokens, llamaCppGreedy, a.Rows, a.MaxNMSE, prefill, bound)
					table = append(table, row)
					t.Log(row)
					assert.GreaterOrEqual(t, a.Tokens, ty.tokens, "%s: greedy tokens agreeing with llama.cpp (xpu %v, llama.cpp %v)", be, ours.Tokens, theirs.Tokens)
					assert.LessOrEqual(t, a.MaxNMSE, bound, "%s: worst logits NMSE against llama.cpp over %d rows", be, a.Rows)
					assert.LessOrEqual(t, prefill, bound, "%s: logits NMSE against llama.cpp after the prompt as one prefill", be)
				}
			})
		}
	}
	t.Logf("xpu against llama.cpp (%s), 6M preset, %d-token prompt:\n| arch | weights | KV cache | xpu backend | greedy tokens equal | logits rows (decode) | max NMSE | prefill NMSE | bound |\n|---|---|---|---|---|---|---|---|---|\n%s",
		os.Getenv("LLAMA_BIN"), len(llamaCppPrompt), strings.Join(table, "\n"))
}

// compareLlamaCpp counts tokens to the first difference, judges only rows both sides computed on
// the same tokens, and refuses runs that are not comparable.
func TestCompareLlamaCpp(t *testing.T) {
	row := func(xs ...float32) []float32 { return xs }
	base := llamaCppRun{NVocab: 3, Prompt: []int32{1, 2},
		Logits: [][]float32{row(1, 2, 3), row(3, 2, 1), row(0, 1, 0), row(5, 5, 5)}, Tokens: []int32{2, 0, 1}}
	with := func(f func(r *llamaCppRun)) llamaCppRun {
		r := base
		r.Logits = append([][]float32(nil), base.Logits...)
		r.Tokens = append([]int32(nil), base.Tokens...)
		f(&r)
		return r
	}
	cases := []struct {
		name    string
		ours    llamaCppRun
		want    llamaCppAgreement
		wantErr string
	}{
		{"identical", base, llamaCppAgreement{Tokens: 3, Rows: 4}, ""},
		{"one row off", with(func(r *llamaCppRun) { r.Logits[1] = row(3, 2, 2) }), llamaCppAgreement{Tokens: 3, Rows: 4, MaxNMSE: 1.0 / 14}, ""},
		// the second generated token differs: rows after it (index 3) are not compared, so
		// its wild values do not count
		{"diverged", with(func(r *llamaCppRun) { r.Tokens[1] = 2; r.Logits[3] = row(50, 0, 0) }), llamaCppAgreement{Tokens: 1, Rows: 3}, ""},
		{"other prompt", with(func(r *llamaCppRun) { r.Prompt = []int32{1, 3} }), llamaCppAgreement{}, "prompts differ"},
		{"other vocabulary", with(func(r *llamaCppRun) { r.NVocab = 4 }), llamaCppAgreement{}, "vocabularies differ"},
		{"short row", with(func(r *llamaCppRun) { r.Logits[0] = row(1, 2) }), llamaCppAgreement{}, "row 0 has 2 and 3 values"},
		{"no rows", with(func(r *llamaCppRun) { r.Logits = nil }), llamaCppAgreement{}, "no logits rows"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := compareLlamaCpp(c.ours, base)
			if c.wantErr != "" {
				require.ErrorContains(t, err, c.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.want.Tokens, got.Tokens)
			assert.Equal(t, c.want.Rows, got.Rows)
			assert.InDelta(t, c.want.MaxNMSE, got.MaxNMSE, 1e-12)
		})
	}
	assert.Equal(t, int32(1), argmax(row(0, 3, 3, 1)), "ties go to the lowest id, as in logits.c")
}

// q8Bound grows with the depth past 8 layers and doubles for a GELU FFN.
func TestQ8Bound(t *testing.T) {
	cases := []struct {
		name   string
		layers int
		act    arch.Activation
		want   float64
	}{
		{"shallow silu", 2, arch.ActSiLU, 1e-3},
		{"8 layers silu", 8, arch.ActSiLU, 1e-3},
		{"16 layers silu", 16, arch.ActSiLU, 2e-3},
		{"8 layers gelu", 8, arch.ActGELU, 2e-3},
		{"gemma2's 26 layers", 26, arch.ActGELU, 6.5e-3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.InDelta(t, c.want, q8Bound(llm.Config{Layers: c.layers, Activation: c.act}), 1e-12)
		})
	}
}
