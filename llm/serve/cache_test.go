package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/xpuhub/xpu/llm/prompt"
)

// chatTurn posts a greedy chat completion of msgs, streamed (with the usage chunk) or not, and
// returns the reply and the usage's cached_tokens.
func chatTurn(t *testing.T, url string, msgs []prompt.Message, stream bool) (string, int) {
	t.Helper()
	body, err := json.Marshal(map[string]any{"model": "stories", "stream": stream, "temperature": 0,
		"max_tokens": 4, "messages": msgs, "stream_options": map[string]bool{"include_usage": stream}})
	require.NoError(t, err)
	if !stream {
		code, b := post(t, url+"/v1/chat/completions", string(body))
		require.Equal(t, http.StatusOK, code, string(b))
		var resp struct {
			Choices []struct{ Message struct{ Content string } }
			Usage   struct {
				PromptTokensDetails struct {
					CachedTokens *int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			}
		}
		require.NoError(t, json.Unmarshal(b, &resp), string(b))
		require.NotNil(t, resp.Usage.PromptTokensDetails.CachedTokens, "usage without cached_tokens: %s", b)
		return resp.Choices[0].Message.Content, *resp.Usage.PromptTokensDetails.CachedTokens
	}
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
	require.NoError(t, err)
	defer resp.Body.Close()
	events, done := readSSE(t, resp.Body)
	require.True(t, done)
	var text strings.Builder
	for _, ev := range events[:len(events)-1] {
		if d, ok := ev["choices"].([]any)[0].(map[string]any)["delta"].(map[string]any); ok {
			s, _ := d["content"].(string)
			text.WriteString(s)
		}
	}
	u := events[len(events)-1]["usage"].(map[string]any)
	details := u["prompt_tokens_details"].(map[string]any)
	return text.String(), int(details["cached_tokens"].(float64))
}

// expectedCached is what a request for msgs should reuse of sl's cache: the prefix its prompt's
// tokens share with the cache, all but the last prompt token at most.
func expectedCached(t *testing.T, srv *Server, sl *slot, msgs []prompt.Message) (int, []int32) {
	t.Helper()
	_, ids, err := srv.tmpl.Prompt(srv.tok, msgs)
	require.NoError(t, err)
	return min(sl.r.CachedPrefix(ids), len(ids)-1), ids
}

// A 10-turn chat resent turn by turn, alternately streamed and not: each turn reuses exactly
// the prefix its prompt shares with the cache, which grows turn by turn, and answers what a
// server without the cache answers.
func TestPromptCacheResentChat(t *testing.T) {
	hs, srv := newTestServer(t, WithParallel(1))
	ref, refSrv := newTestServer(t, WithParallel(1))
	msgs := []prompt.Message{{Role: "system", Content: "Be kind."}}
	last := 0
	for turn := range 10 {
		msgs = append(msgs, prompt.Message{Role: "user", Content: fmt.Sprintf("Day %d.", turn+1)})
		want, ids := expectedCached(t, srv, srv.all[0], msgs)
		stream := turn%2 == 1
		reply, cached := chatTurn(t, hs.URL, msgs, stream)
		assert.Equal(t, want, cached, "turn %d: the shared prefix", turn+1)
		if turn == 0 {
			assert.Zero(t, cached)
		} else {
			assert.Greater(t, cached, last, "turn %d reuses more than the turn before", turn+1)
			assert.Greater(t, 2*cached, len(ids), "turn %d reuses most of its %d prompt tokens", turn+1, len(ids))
		}
		last = cached

		refSrv.all[0].r.Reset() // the reference prefills the whole conversation
		again, refCached := chatTurn(t, ref.URL, msgs, stream)
		assert.Zero(t, refCached)
		assert.Equal(t, again, reply, "turn %d: the cache changes nothing in the answer", turn+1)
		msgs = append(msgs, prompt.Message{Role: "assistant", Content: reply})
	}
}

// Completions reuse the cache too: a prompt that extends the last one feeds only the new text.
func TestPromptCacheCompletions(t *testing.T) {
	hs, _ := newTestServer(t)
	complete := func(prompt string) (string, int) {
		b, err := json.Marshal(map[string]any{"model": "stories", "prompt": prompt, "max_tokens": 4, "temperature": 0})
		require.NoError(t, err)
		code, out := post(t, hs.URL+"/v1/completions", string(b))
		require.Equal(t, http.StatusOK, code, string(out))
		var resp struct {
			Choices []struct{ Text string }
			Usage   struct {
				PromptTokens        int `json:"prompt_tokens"`
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			}
		}
		require.NoError(t, json.Unmarshal(out, &resp))
		return resp.Choices[0].Text, resp.Usage.PromptTokensDetails.CachedTokens
	}
	_, first := complete("Once upon a time, there was a little girl named Lily.")
	assert.Zero(t, first)
	_, second := complete("Once upon a time, there was a little girl named Lily. She liked to play.")
	assert.GreaterOrEqual(t, second, 10, "the first sentence's tokens are reused")
	// the same prompt again: everything but the last token, which is fed for its logits
	text3, third := complete("Once upon a time, there was a little dog.")
	assert.Positive(t, third)
	assert.Less(t, third, second)
	_, again := complete("Once upon a time, there was a little dog.")
	text4, again2 := complete("Once upon a time, there was a little dog.")
	assert.Equal(t, again, again2, "the whole prompt but its last token")
	assert.Equal(t, text3, text4)
}

// Two conversations resent turn by turn, interleaved, on two runners: each comes back to the
// runner that answered its last turn and reuses its cache, instead of taking the other's for
// the template text both begin with.
func TestPromptCacheKeepsSlotsApart(t *testing.T) {
	hs, srv := newTestServer(t, WithParallel(2))
	convs := [2][]prompt.Message{}
	owner := [2]*slot{}
	for turn := range 4 {
		for c := range convs {
			convs[c] = append(convs[c], prompt.Message{Role: "user", Content: fmt.Sprintf("Conversation %c, turn %d: tell me a story.", 'A'+c, turn+1)})
			reply, cached := chatTurn(t, hs.URL, convs[c], c == 1)
			convs[c] = append(convs[c], prompt.Message{Role: "assistant", Content: reply})
			// the slot now holding this conversation's prompt
			_, ids, err := srv.tmpl.Prompt(srv.tok, convs[c][:len(convs[c])-1])
			require.NoError(t, err)
			var holder *slot
			for _, sl := range srv.all {
				if sl.r.CachedPrefix(ids) == len(ids) {
					holder = sl
				}
			}
			require.NotNil(t, holder, "conversation %d turn %d: no runner holds its prompt", c, turn+1)
			if turn == 0 {
				owner[c] = holder
				assert.Less(t, cached, 8, "conversation %d: a new conversation reuses at most the template's header", c)
				continue
			}
			assert.Same(t, owner[c], holder, "conversation %d turn %d came back to its runner", c, turn+1)
			assert.Greater(t, 2*cached, len(ids), "conversation %d turn %d reuses most of its prompt", c, turn+1)
		}
	}
	assert.NotSame(t, owner[0], owner[1])
}

// The queue is first come, first served; a waiter that gives up leaves it, and a slot put back
// goes to the next one still waiting.
func TestPoolQueueOrder(t *testing.T) {
	_, srv := newTestServer(t)
	p := &srv.slots
	held := p.take(nil)
	require.NotNil(t, held)
	assert.Nil(t, p.take(nil), "the only slot is held")

	ctxA, cancelA := context.WithCancel(context.Background())
	gotA := make(chan *slot, 1)
	go func() { sl, _ := p.get(ctxA, nil, 2); gotA <- sl }()
	require.Eventually(t, func() bool { return p.waiting() == 1 }, 10*time.Second, time.Millisecond)
	gotB := make(chan *slot, 1)
	go func() { sl, _ := p.get(context.Background(), nil, 2); gotB <- sl }()
	require.Eventually(t, func() bool { return p.waiting() == 2 }, 10*time.Second, time.Millisecond)
	_, full := p.get(context.Background(), nil, 2)
	assert.True(t, full, "a third waiter finds the queue full")

	cancelA()
	assert.Nil(t, <-gotA, "A gave up")
	assert.Equal(t, 1, p.waiting())
	p.put(held)
	assert.Same(t, held, <-gotB, "B, still waiting, gets the slot")
	assert.Zero(t, p.waiting())
	assert.Zero(t, p.idle())
	p.put(held)
	assert.Equal(t, 1, p.idle())
}
