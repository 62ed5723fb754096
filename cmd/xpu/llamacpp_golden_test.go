package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/gguf"
	"github.com/xpuhub/xpu/llm/synth"
)

// quantGoldenFile holds what llama-quantize wrote for goldenQuantSpec's model, recipe by
// recipe: each tensor's type and the SHA-256 of its bytes. scripts/llamacpp-goldens.sh
// regenerates it from a llama.cpp build (XPU_LLAMACPP_GOLDEN=update with LLAMA_BIN); no
// llama.cpp code is in this repository, only these outputs.
const quantGoldenFile = "testdata/llamacpp/quantize.json"

// goldenQuantSpec is the float model the goldens are made from: one llama layer whose rows are
// all multiples of 256, as the K-quants need, and small enough to quantize eleven ways under
// -race.
func goldenQuantSpec() synth.Spec {
	return synth.Spec{Arch: "llama", Name: "llamacpp-golden", Dim: 256, Layers: 1, Heads: 4, KVHeads: 2,
		FFN: 512, Vocab: 512, Context: 64, Type: core.F32, Seed: 7}
}

// quantGoldenArgs are llama-quantize's arguments for each xpu recipe: the _M mixes are
// llama.cpp's own rules; the plain types are --pure (every matrix that type), as xpu's plain
// recipes are.
var quantGoldenArgs = map[string][]string{
	"q4_k_m": {"Q4_K_M"},
	"q5_k_m": {"Q5_K_M"},
	"q6_k":   {"--pure", "Q6_K"},
	"q4_k":   {"--pure", "Q4_K_S"},
	"q5_k":   {"--pure", "Q5_K_S"},
	"q3_k":   {"--pure", "Q3_K_M"},
	"q2_k":   {"--pure", "Q2_K"},
	"q8_0":   {"--pure", "Q8_0"},
	"q4_0":   {"--pure", "Q4_0"},
	"f16":    {"--pure", "F16"},
	"bf16":   {"--pure", "BF16"},
}

type tensorHash struct {
	Type   string `json:"type"`
	SHA256 string `json:"sha256"`
}

type quantGolden struct {
	LlamaCpp string `json:"llama_cpp"` // the llama.cpp commit the goldens came from
	// Source is the float model's tensors: a change of the generator shows here, not as a
	// quantizer mismatch.
	Source  map[string]tensorHash `json:"source"`
	Recipes map[string]struct {
		LlamaQuantize []string              `json:"llama_quantize"`
		Tensors       map[string]tensorHash `json:"tensors"`
	} `json:"recipes"`
}

// tensorHashes is every tensor of the GGUF file at path with its type and bytes' SHA-256.
func tensorHashes(t *testing.T, path string) map[string]tensorHash {
	t.Helper()
	f, err := gguf.Open(path)
	require.NoError(t, err)
	defer f.Close()
	out := map[string]tensorHash{}
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		sum := sha256.Sum256(f.TensorData(ti))
		out[ti.Name] = tensorHash{Type: ti.DType.String(), SHA256: hex.EncodeToString(sum[:])}
	}
	return out
}

// xpu quantize writes, for every recipe, the tensor types and bytes llama-quantize wrote for the
// same float model (the goldens): the quantizers are bit-exact with ggml's reference ones.
// With XPU_LLAMACPP_GOLDEN=update and LLAMA_BIN the goldens are rewritten from llama.cpp
// instead (scripts/llamacpp-goldens.sh).
func TestQuantizeMatchesLlamaCppGoldens(t *testing.T) {
	dir := t.TempDir()
	f32 := filepath.Join(dir, "f32.gguf")
	require.NoError(t, synth.WriteFile(f32, goldenQuantSpec()))
	source := tensorHashes(t, f32)

	if os.Getenv("XPU_LLAMACPP_GOLDEN") == "update" {
		bin := llamaBin(t, "llama-quantize")
		var g quantGolden
		g.LlamaCpp = os.Getenv("LLAMA_CPP_COMMIT")
		g.Source = source
		g.Recipes = map[string]struct {
			LlamaQuantize []string              `json:"llama_quantize"`
			Tensors       map[string]tensorHash `json:"tensors"`
		}{}
		for recipe, args := range quantGoldenArgs {
			out := filepath.Join(dir, recipe+".gguf")
			llamaRun(t, bin, "llama-quantize", slices.Concat(args[:len(args)-1], []string{f32, out}, args[len(args)-1:])...)
			g.Recipes[recipe] = struct {
				LlamaQuantize []string              `json:"llama_quantize"`
				Tensors       map[string]tensorHash `json:"tensors"`
			}{args, tensorHashes(t, out)}
		}
		b, err := json.MarshalIndent(g, "", " ")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(quantGoldenFile, append(b, '\n'), 0o644))
		t.Logf("wrote %s", quantGoldenFile)
		return
	}

	b, err := os.ReadFile(quantGoldenFile)
	require.NoError(t, err)
	var g quantGolden
	require.NoError(t, json.Unmarshal(b, &g))
	require.Equal(t, g.Source, source, "the float model changed since the goldens were made: run scripts/llamacpp-goldens.sh")
	for recipe := range quantGoldenArgs {
		t.Run(recipe, func(t *testing.T) {
			want, ok := g.Recipes[recipe]
			require.True(t, ok, "no golden for %s: run scripts/llamacpp-goldens.sh", recipe)
			out := filepath.Join(dir, recipe+".gguf")
			code, _, errOut := runCLI(t, "quantize", "--type", recipe, f32, out)
			require.Equal(t, 0, code, errOut)
			got := tensorHashes(t, out)
			require.Len(t, got, len(want.Tensors))
			for name, w := range want.Tensors {
				assert.Equal(t, w, got[name], "%s: %s (llama-quantize %v)", recipe, name, want.LlamaQuantize)
			}
		})
	}
}
