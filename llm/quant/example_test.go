package quant_test

import (
	"fmt"
	"strings"

	"github.com/xpuhub/xpu/llm/quant"
)

// The recipes of xpu quantize --type: llama.cpp's K-quant mixes first, then one dtype for every
// matrix.
func ExampleRecipes() {
	fmt.Println(strings.Join(quant.Recipes(), " "))
	r, err := quant.ParseRecipe("Q4_K_M")
	fmt.Println(r.Name, r.Base, err)
	// Output:
	// q4_k_m q5_k_m q6_k q4_k q5_k q3_k q2_k q8_0 q4_0 f16 bf16
	// q4_k_m q4_k <nil>
}
