package serve

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"

	"github.com/xpuhub/xpu/llm/sample"
)

// Every parameter of OpenAI's chat and completions APIs is either honoured or, when the server
// knows it but cannot honour it, refused with a 400 naming it (docs/openai-api.md has the
// table); fields nobody defined are ignored, as OpenAI ignores them. A refused parameter is
// still accepted at its neutral value (null, false, "none", an empty list), which clients send
// by default.

// MaxChoices bounds n: the choices run at once on the runners free when the request starts
// (their decodes batched), or one after another on one runner.
const MaxChoices = 16

// unsupported is a known parameter the server cannot honour; neutral says whether a value asks
// for nothing the server would have to do.
type unsupported struct {
	param   string
	neutral func(json.RawMessage) bool
	why     string
}

func isNull(v json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(v), []byte("null")) }

// oneOf is neutral for null and the given JSON values (compared after compaction).
func oneOf(vals ...string) func(json.RawMessage) bool {
	return func(v json.RawMessage) bool {
		if isNull(v) {
			return true
		}
		var c bytes.Buffer
		if json.Compact(&c, v) != nil {
			return false
		}
		for _, s := range vals {
			if c.String() == s {
				return true
			}
		}
		return false
	}
}

var chatRefusals = []unsupported{
	{"audio", oneOf(), "audio output is not supported"},
	{"modalities", oneOf(`["text"]`), "only the text modality is supported"},
	{"prediction", oneOf(), "predicted outputs are not supported"},
	{"reasoning_effort", oneOf(), "reasoning_effort is for reasoning models; this model has no reasoning budget"},
	{"verbosity", oneOf(), "verbosity is not supported"},
	{"web_search_options", oneOf(), "web search is not supported"},
	{"functions", oneOf(`[]`), "functions (deprecated function calling) are not supported"},
	{"function_call", oneOf(`"none"`, `"auto"`), "function_call (deprecated function calling) is not supported"},
	{"store", oneOf(`false`), "store: this server stores no completions"},
}

var completionRefusals = []unsupported{
	{"suffix", oneOf(`""`), "suffix (insertion) is not supported"},
}

// refuse returns a 400 for the first parameter xpu knows but does not honour (audio,
// prediction, ...) that body sets to a non-neutral value.
func refuse(body json.RawMessage, rules []unsupported) *apiError {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return badRequest("", "invalid_json", "invalid JSON body: %v", err)
	}
	for _, r := range rules {
		if v, ok := fields[r.param]; ok && !r.neutral(v) {
			return badRequest(r.param, "unsupported_parameter", "%s", r.why)
		}
	}
	return nil
}

// knobs are the sampling parameters both endpoints share: OpenAI's and llama-server's
// extensions (top_k, min_p, typical_p, repeat_penalty, repeat_last_n).
type knobs struct {
	Temperature      *float64           `json:"temperature"`
	TopP             *float64           `json:"top_p"`
	Seed             *int64             `json:"seed"`
	FrequencyPenalty *float64           `json:"frequency_penalty"`
	PresencePenalty  *float64           `json:"presence_penalty"`
	LogitBias        map[string]float64 `json:"logit_bias"`
	TopK             *int               `json:"top_k"`
	MinP             *float64           `json:"min_p"`
	TypicalP         *float64           `json:"typical_p"`
	RepeatPenalty    *float64           `json:"repeat_penalty"`
	RepeatLastN      *int               `json:"repeat_last_n"`
	// NKeep is llama-server's n_keep: the prompt tokens a context shift keeps (after BOS; -1:
	// the whole prompt), on a server that shifts (WithContextShift).
	NKeep *int `json:"n_keep"`
}

// sampler checks the knobs' ranges and builds the sampler; vocab bounds logit_bias's token
// ids and ctxLen is repeat_last_n -1 (llama.cpp's "the whole context").
func (k *knobs) sampler(vocab, ctxLen int) (sample.Config, *apiError) {
	// OpenAI's defaults: temperature 1, top_p 1; no seed draws one.
	c := sample.Config{Temperature: 1, TopP: 1, RepeatPenalty: 1}
	in := func(v *float64, lo, hi float64) bool { return !math.IsNaN(*v) && *v >= lo && *v <= hi }
	if v := k.Temperature; v != nil {
		if !in(v, 0, 2) {
			return c, badRequest("temperature", "invalid_value", "temperature %g: must be between 0 and 2", *v)
		}
		c.Temperature = float32(*v)
	}
	if v := k.TopP; v != nil {
		if !(*v > 0 && *v <= 1) {
			return c, badRequest("top_p", "invalid_value", "top_p %g: must be in (0, 1]", *v)
		}
		c.TopP = float32(*v)
	}
	if v := k.FrequencyPenalty; v != nil {
		if !in(v, -2, 2) {
			return c, badRequest("frequency_penalty", "invalid_value", "frequency_penalty %g: must be between -2 and 2", *v)
		}
		c.FrequencyPenalty = float32(*v)
	}
	if v := k.PresencePenalty; v != nil {
		if !in(v, -2, 2) {
			return c, badRequest("presence_penalty", "invalid_value", "presence_penalty %g: must be between -2 and 2", *v)
		}
		c.PresencePenalty = float32(*v)
	}
	if len(k.LogitBias) > 0 {
		c.LogitBias = make(map[int32]float32, len(k.LogitBias))
		for key, b := range k.LogitBias {
			id, err := strconv.ParseInt(key, 10, 32)
			if err != nil || id < 0 || int(id) >= vocab {
				return c, badRequest("logit_bias", "invalid_value", "logit_bias key %q: must be a token id from 0 to %d", key, vocab-1)
			}
			if !in(&b, -100, 100) {
				return c, badRequest("logit_bias", "invalid_value", "logit_bias of token %d is %g: must be between -100 and 100", id, b)
			}
			c.LogitBias[int32(id)] = float32(b)
		}
	}
	if v := k.TopK; v != nil {
		if *v < 0 {
			return c, badRequest("top_k", "invalid_value", "top_k %d: must be 0 (off) or more", *v)
		}
		c.TopK = *v
	}
	if v := k.MinP; v != nil {
		if !in(v, 0, 1) {
			return c, badRequest("min_p", "invalid_value", "min_p %g: must be between 0 and 1", *v)
		}
		c.MinP = float32(*v)
	}
	if v := k.TypicalP; v != nil {
		if !in(v, 0, 1) {
			return c, badRequest("typical_p", "invalid_value", "typical_p %g: must be between 0 and 1 (1 = off)", *v)
		}
		c.TypicalP = float32(*v)
	}
	if v := k.RepeatPenalty; v != nil {
		if !in(v, 0, 100) {
			return c, badRequest("repeat_penalty", "invalid_value", "repeat_penalty %g: must be between 0 and 100 (1 = off)", *v)
		}
		c.RepeatPenalty = float32(*v)
	}
	if v := k.RepeatLastN; v != nil {
		switch {
		case *v == -1:
			c.RepeatLastN = ctxLen
		case *v == 0: // llama.cpp's "no penalties"
			c.RepeatPenalty, c.FrequencyPenalty, c.PresencePenalty = 1, 0, 0
		case *v < 0:
			return c, badRequest("repeat_last_n", "invalid_value", "repeat_last_n %d: must be -1 (the context), 0 (no penalties) or more", *v)
		default:
			c.RepeatLastN = *v
		}
	}
	if k.Seed != nil {
		c.Seed = uint64(*k.Seed)
	} else {
		c.Seed = randomSeed()
	}
	if err := c.Validate(); err != nil {
		return c, badRequest("", "invalid_value", "%v", err)
	}
	return c, nil
}
