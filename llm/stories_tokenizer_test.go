package llm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// storiesGreedyPrefix is the start of the token sequence stories260K generates greedily from BOS
// (recorded from the model; TestStoriesGreedy checks the text it decodes to).
var storiesGreedyPrefix = []int32{403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395,
	317, 426, 338, 401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385,
	328, 432, 358, 394, 261, 370, 432, 352}

func TestStoriesTokenizer(t *testing.T) {
	m := openStories(t)
	tk := m.Tokenizer
	text := tk.Decode(storiesGreedyPrefix)
	assert.True(t, strings.HasPrefix(text, "Once upon a time, there was a little girl named Lily."), text)
	// The model's own greedy tokens are the tokenizer's segmentation of their text.
	assert.Equal(t, append([]int32{1}, storiesGreedyPrefix...), tk.Encode(text, true))

	want, err := os.ReadFile(filepath.Join(modelsDir(t), "stories260K.greedy.txt"))
	require.NoError(t, err)
	ids := tk.Encode(string(want), true)
	assert.Equal(t, string(want), tk.Decode(ids), "encode/decode round trip of the whole sample")
	assert.Equal(t, "\n", tk.Piece(13), "<0x0A> decodes to a newline byte")
	assert.Equal(t, int32(1), tk.BOS())
	assert.Equal(t, int32(2), tk.EOS())
}
