package w8a8_test

import (
	"fmt"

	"github.com/xpuhub/xpu/llm/w8a8"
)

// One activation channel far beyond the rest: the rule leaves it out of the scale, so the int8
// grid serves the bulk, and marks it hot, so the shadow path computes it in float.
func ExampleRule_Analyze() {
	const tokens, width = 4, 8
	xs := make([]float32, tokens*width)
	for i := range xs {
		xs[i] = float32(i%7) / 7
	}
	for t := range tokens {
		xs[t*width+5] = 60 // the outlier channel
	}
	in, err := w8a8.DefaultRule.Analyze("attn_in", xs, width)
	if err != nil {
		panic(err)
	}
	fmt.Printf("scale %.5f, threshold %.3f, outlier channels %v, hot %v, %d outliers\n",
		in.Scale, in.Threshold, in.OutlierChannels, in.Hot, in.Outliers)
	// Output:
	// scale 0.00675, threshold 0.857, outlier channels [5], hot [5], 4 outliers
}
