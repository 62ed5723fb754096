package llm

import (
	"context"
	"slices"
	"strings"

	"github.com/xpuhub/xpu/llm/prompt"
)

// prompt.Template is the model's tokenizer.chat_template, or prompt.Fallback when the file has
// none (IsFallback then says so).
func (m *Model) ChatTemplate() (*prompt.Template, error) {
	if v, ok := m.File.Get("tokenizer.chat_template"); ok {
		if src, ok := v.Str(); ok && strings.TrimSpace(src) != "" {
			return prompt.New(m.Tokenizer, src)
		}
	}
	return prompt.NewFallback(m.Tokenizer)
}

// Chat is a multi-turn conversation on one Runner. Each turn renders the whole conversation
// with the template and feeds the runner only what its KV cache does not already hold: the
// cache is kept up to the longest prefix its tokens share with the new prompt's
// (WithPromptCache). Not safe for concurrent use.
type Chat struct {
	r      *Runner
	tmpl   *prompt.Template
	stops  []string
	system string
	msgs   []prompt.Message
}

type chatConfig struct {
	system   string
	template string
	stops    []string
}

// ChatOption configures NewChat.
type ChatOption func(*chatConfig)

// WithSystemPrompt starts the conversation with a system message.
func WithSystemPrompt(s string) ChatOption { return func(c *chatConfig) { c.system = s } }

// WithChatTemplate uses src instead of the model's template.
func WithChatTemplate(src string) ChatOption { return func(c *chatConfig) { c.template = src } }

// WithChatStops adds stop strings that end a reply (prompt.FallbackStops are added for the fallback
// template).
func WithChatStops(stops ...string) ChatOption {
	return func(c *chatConfig) { c.stops = append(c.stops, stops...) }
}

// NewChat starts a conversation on r. The runner's cache is emptied; the chat owns the runner
// until it is no longer used.
func NewChat(r *Runner, opts ...ChatOption) (*Chat, error) {
	var cfg chatConfig
	for _, o := range opts {
		o(&cfg)
	}
	var tmpl *prompt.Template
	var err error
	if cfg.template != "" {
		tmpl, err = prompt.New(r.Model().Tokenizer, cfg.template)
	} else {
		tmpl, err = r.Model().ChatTemplate()
	}
	if err != nil {
		return nil, err
	}
	stops := slices.Clone(cfg.stops)
	if tmpl.IsFallback() {
		stops = append(stops, prompt.FallbackStops...)
	}
	c := &Chat{r: r, tmpl: tmpl, stops: stops, system: cfg.system}
	c.Reset()
	return c, nil
}

// NewChat starts a conversation on the engine's runner.
func (e *Engine) NewChat(opts ...ChatOption) (*Chat, error) { return NewChat(e.Runner, opts...) }

// Reset forgets every turn (the system prompt stays) and empties the cache.
func (c *Chat) Reset() {
	c.msgs = c.msgs[:0]
	if c.system != "" {
		c.msgs = append(c.msgs, prompt.Message{Role: "system", Content: c.system})
	}
	c.r.Reset()
}

// Messages returns the conversation so far.
func (c *Chat) Messages() []prompt.Message { return slices.Clone(c.msgs) }

// Template is the template the chat renders with.
func (c *Chat) Template() *prompt.Template { return c.tmpl }

// Send adds the user's message, generates the assistant's reply (opts as for Generate:
// WithStream, WithMaxTokens, WithSampler) and adds it to the conversation. On an error the
// user's message is taken back and the conversation is as before.
func (c *Chat) Send(ctx context.Context, user string, opts ...GenerateOption) (Result, error) {
	msgs := append(slices.Clone(c.msgs), prompt.Message{Role: "user", Content: user})
	res, err := c.complete(ctx, msgs, nil, opts...)
	if err != nil {
		return res, err
	}
	c.msgs = append(msgs, prompt.Message{Role: "assistant", Content: res.Text})
	return res, nil
}

// Complete generates the assistant's reply to msgs (a whole conversation, as an API server
// receives it) without keeping it; the runner's cache is reused where msgs extend what it
// holds.
func (c *Chat) Complete(ctx context.Context, msgs []prompt.Message, opts ...GenerateOption) (Result, error) {
	return c.CompleteTools(ctx, msgs, nil, opts...)
}

// CompleteTools is Complete with the tools the model may call rendered into the prompt
// (prompt.Template.RenderToolsContext); the reply is the model's text, which a caller parses for
// calls in the model family's format.
func (c *Chat) CompleteTools(ctx context.Context, msgs []prompt.Message, tools []any, opts ...GenerateOption) (Result, error) {
	return c.complete(ctx, msgs, tools, opts...)
}

func (c *Chat) complete(ctx context.Context, msgs []prompt.Message, tools []any, opts ...GenerateOption) (Result, error) {
	prompt, full, err := c.tmpl.PromptToolsContext(ctx, c.r.Model().Tokenizer, msgs, tools)
	if err != nil {
		return Result{}, err
	}
	// The cache is reused up to where its tokens and the whole conversation's part (a reply
	// re-encoded as the template renders it may split differently, a stop string leaves text
	// past the reply): only the tokens past that are fed.
	opts = append(slices.Clone(opts), WithPromptCache(), WithPromptTokens(full))
	res, err := c.r.GenerateUntil(ctx, prompt, c.stops, opts...)
	if err != nil {
		return res, err
	}
	// At the token budget the last token was sampled but not fed: feed it, so that the next
	// turn finds the whole reply in the cache.
	if res.Stop == StopMaxTokens && len(res.Tokens) > 0 && c.r.Len() < c.r.ContextLength() {
		if _, err := c.r.Decode(ctx, res.Tokens[len(res.Tokens)-1]); err != nil {
			return res, err
		}
	}
	return res, nil
}
