package llm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/xpuhub/xpu/internal/jinja"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/tokenizer"
)

// Message is one turn of a conversation.
type Message struct {
	Role    string `json:"role"` // "system", "user", "assistant" or "tool"
	Content string `json:"content"`
	// ToolCalls are the calls an assistant's turn made (rendered as Hugging Face's
	// apply_chat_template receives them: {"id", "type": "function", "function": {"name",
	// "arguments"}}, the arguments parsed from their JSON text when they are an object).
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// ToolCallID is the call a "tool" turn answers.
	ToolCallID string `json:"tool_call_id,omitempty"`
}

// ToolCall is one function call of an assistant's turn.
type ToolCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"` // JSON text
}

// templateValue is m as a chat template receives it.
func (m Message) templateValue() map[string]any {
	v := map[string]any{"role": m.Role, "content": m.Content}
	if len(m.ToolCalls) > 0 {
		calls := make([]any, len(m.ToolCalls))
		for i, c := range m.ToolCalls {
			var args any = c.Arguments
			var obj map[string]any
			if json.Unmarshal([]byte(c.Arguments), &obj) == nil {
				args = obj
			}
			calls[i] = map[string]any{"id": c.ID, "type": "function",
				"function": map[string]any{"name": c.Name, "arguments": args}}
		}
		v["tool_calls"] = calls
	}
	if m.ToolCallID != "" {
		v["tool_call_id"] = m.ToolCallID
	}
	return v
}

// FallbackChatTemplate renders conversations for models whose GGUF file has no
// tokenizer.chat_template (base models such as stories260K): the system prompt as a
// paragraph, then "User: ..." and "Assistant: ..." lines, ending with "Assistant:" when a reply
// is wanted (a reply, which the model starts with a space, is written back trimmed, so that
// the next turn's text extends the cached one). FallbackStops ends a reply where the model starts the user's next line.
const FallbackChatTemplate = `{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}

{% elif m.role == 'user' %}User: {{ m.content }}
{% else %}Assistant: {{ m.content | trim }}
{% endif %}{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}`

// FallbackStops are the stop strings that go with FallbackChatTemplate.
var FallbackStops = []string{"\nUser:"}

// ChatTemplate renders a conversation into the prompt text a model was trained on. It is safe
// for concurrent use.
type ChatTemplate struct {
	tmpl     *jinja.Template
	fallback bool
	bos, eos string
}

// ErrTemplateLimit is wrapped by the errors of a chat template that broke a rendering limit
// (TemplateLimits, or its time): a chat template comes from the model file, so it is untrusted
// input, and one that recurses, builds huge text or loops for long is stopped, never left to
// crash or hang the process.
var ErrTemplateLimit = jinja.ErrLimit

// templateLimits bound every render of a chat template: macro calls nest at most 64 deep
// (recursion), it builds at most 64 MiB and runs at most ten million steps (nodes and loop
// iterations), each far above what real templates need. A render also stops when its context
// ends, and after TemplateTimeout at most.
var templateLimits = jinja.Limits{MaxDepth: 64, MaxBytes: 64 << 20, MaxSteps: 10_000_000}

// TemplateTimeout bounds one render of a chat template whatever its context.
const TemplateTimeout = 5 * time.Second

// maxTemplateBytes bounds a chat template's source (real ones are a few KiB).
const maxTemplateBytes = 1 << 20

// loadCheckTimeout bounds the trial render NewChatTemplate makes.
const loadCheckTimeout = time.Second

// NewChatTemplate compiles a Jinja chat template (as found in tokenizer.chat_template) for m's
// tokenizer (whose BOS and EOS texts it receives as bos_token and eos_token). It renders a
// short conversation once, so that a template that breaks the rendering limits on any input
// (ErrTemplateLimit) is refused here rather than on every request.
func NewChatTemplate(m *Model, src string) (*ChatTemplate, error) {
	if len(src) > maxTemplateBytes {
		return nil, fmt.Errorf("llm: chat template of %d bytes, more than %d: %w: %w", len(src), maxTemplateBytes,
			ErrTemplateLimit, core.ErrInvalidArgument)
	}
	t, err := jinja.Compile(src)
	if err != nil {
		return nil, fmt.Errorf("llm: chat template: %w: %w", err, core.ErrInvalidArgument)
	}
	ct := &ChatTemplate{tmpl: t}
	tok := m.Tokenizer
	if b := tok.BOS(); b >= 0 && int(b) < tok.Size() {
		ct.bos = tok.Vocab().Tokens[b]
	}
	if e := tok.EOS(); e >= 0 && int(e) < tok.Size() {
		ct.eos = tok.Vocab().Tokens[e]
	}
	ctx, cancel := context.WithTimeout(context.Background(), loadCheckTimeout)
	defer cancel()
	trial := []Message{{Role: "system", Content: "You are helpful."}, {Role: "user", Content: "Hello"},
		{Role: "assistant", Content: "Hi!"}, {Role: "user", Content: "Tell me a story."}}
	// other errors (raise_exception on roles this conversation does not suit) are the
	// template's to give for the conversations it refuses
	if _, err := ct.RenderContext(ctx, trial, true); errors.Is(err, ErrTemplateLimit) {
		return nil, fmt.Errorf("llm: chat template: rendering a four-message conversation: %w", err)
	}
	return ct, nil
}

// ChatTemplate is the model's tokenizer.chat_template, or FallbackChatTemplate when the file
// has none (IsFallback then says so).
func (m *Model) ChatTemplate() (*ChatTemplate, error) {
	if v, ok := m.File.Get("tokenizer.chat_template"); ok {
		if src, ok := v.Str(); ok && strings.TrimSpace(src) != "" {
			return NewChatTemplate(m, src)
		}
	}
	ct, err := NewChatTemplate(m, FallbackChatTemplate)
	if err != nil {
		return nil, err
	}
	ct.fallback = true
	return ct, nil
}

// IsFallback says the model has no template of its own and FallbackChatTemplate is used.
func (t *ChatTemplate) IsFallback() bool { return t.fallback }

// Render renders msgs; with addGenerationPrompt the text ends where the assistant's reply
// begins. It is RenderContext without a context of its own.
func (t *ChatTemplate) Render(msgs []Message, addGenerationPrompt bool) (string, error) {
	return t.RenderContext(context.Background(), msgs, addGenerationPrompt)
}

// RenderContext is Render within the rendering limits (ErrTemplateLimit), stopped when ctx ends or after
// TemplateTimeout: the error then wraps ErrTemplateLimit (and ctx's cause).
func (t *ChatTemplate) RenderContext(ctx context.Context, msgs []Message, addGenerationPrompt bool) (string, error) {
	return t.RenderToolsContext(ctx, msgs, nil, addGenerationPrompt)
}

// RenderToolsContext is RenderContext with the tools the model may call, given to the template
// as Hugging Face's apply_chat_template gives them (the OpenAI request's "tools": a list of
// {"type": "function", "function": {"name", "description", "parameters"}}); nil gives none.
func (t *ChatTemplate) RenderToolsContext(ctx context.Context, msgs []Message, tools []any, addGenerationPrompt bool) (string, error) {
	list := make([]any, len(msgs))
	for i, m := range msgs {
		list[i] = m.templateValue()
	}
	ctx, cancel := context.WithTimeout(ctx, TemplateTimeout)
	defer cancel()
	vars := map[string]any{
		"messages":              list,
		"add_generation_prompt": addGenerationPrompt,
		"bos_token":             t.bos,
		"eos_token":             t.eos,
	}
	if tools != nil {
		vars["tools"] = tools
	}
	out, err := t.tmpl.RenderContext(ctx, vars, templateLimits)
	if err != nil {
		return "", fmt.Errorf("llm: render chat template: %w: %w", err, core.ErrInvalidArgument)
	}
	return out, nil
}

// Chat is a multi-turn conversation on one Runner. Each turn renders the whole conversation
// with the template and feeds the runner only what its KV cache does not already hold: the
// cache is kept up to the longest prefix its tokens share with the new prompt's
// (WithPromptCache). Not safe for concurrent use.
type Chat struct {
	r      *Runner
	tmpl   *ChatTemplate
	stops  []string
	system string
	msgs   []Message
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

// WithChatStops adds stop strings that end a reply (FallbackStops are added for the fallback
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
	var tmpl *ChatTemplate
	var err error
	if cfg.template != "" {
		tmpl, err = NewChatTemplate(r.Model(), cfg.template)
	} else {
		tmpl, err = r.Model().ChatTemplate()
	}
	if err != nil {
		return nil, err
	}
	stops := slices.Clone(cfg.stops)
	if tmpl.IsFallback() {
		stops = append(stops, FallbackStops...)
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
		c.msgs = append(c.msgs, Message{Role: "system", Content: c.system})
	}
	c.r.Reset()
}

// Messages returns the conversation so far.
func (c *Chat) Messages() []Message { return slices.Clone(c.msgs) }

// Template is the template the chat renders with.
func (c *Chat) Template() *ChatTemplate { return c.tmpl }

// Send adds the user's message, generates the assistant's reply (opts as for Generate:
// WithStream, WithMaxTokens, WithSampler) and adds it to the conversation. On an error the
// user's message is taken back and the conversation is as before.
func (c *Chat) Send(ctx context.Context, user string, opts ...GenerateOption) (Result, error) {
	msgs := append(slices.Clone(c.msgs), Message{Role: "user", Content: user})
	res, err := c.complete(ctx, msgs, nil, opts...)
	if err != nil {
		return res, err
	}
	c.msgs = append(msgs, Message{Role: "assistant", Content: res.Text})
	return res, nil
}

// Complete generates the assistant's reply to msgs (a whole conversation, as an API server
// receives it) without keeping it; the runner's cache is reused where msgs extend what it
// holds.
func (c *Chat) Complete(ctx context.Context, msgs []Message, opts ...GenerateOption) (Result, error) {
	return c.CompleteTools(ctx, msgs, nil, opts...)
}

// CompleteTools is Complete with the tools the model may call rendered into the prompt
// (ChatTemplate.RenderToolsContext); the reply is the model's text, which a caller parses for
// calls in the model family's format.
func (c *Chat) CompleteTools(ctx context.Context, msgs []Message, tools []any, opts ...GenerateOption) (Result, error) {
	return c.complete(ctx, msgs, tools, opts...)
}

// Prompt renders msgs with the generation prompt and returns the text and the tokens the
// runner is fed for it (with BOS when the vocabulary asks for one; a bos_token the template
// writes itself is dropped so that there is one).
//
// Control tokens come only from the template: a message whose content spells one
// ("<|im_start|>", which would open a turn and let the text write the next one) has that
// content encoded as plain text, wherever the template puts it and whatever the template's own
// text repeats. Prompt finds the contents by rendering the conversation a second time with a
// unique marker for each content (a template may trim a content; it may also repeat it). When
// the template rewrites a content that spells a control token so that it cannot be found, Prompt
// fails with core.ErrInvalidArgument rather than parse it.
func (t *ChatTemplate) Prompt(tok *tokenizer.Tokenizer, msgs []Message) (string, []int32, error) {
	return t.PromptContext(context.Background(), tok, msgs)
}

// PromptContext is Prompt with the rendering bound to ctx (RenderContext).
func (t *ChatTemplate) PromptContext(ctx context.Context, tok *tokenizer.Tokenizer, msgs []Message) (string, []int32, error) {
	return t.PromptToolsContext(ctx, tok, msgs, nil)
}

// PromptToolsContext is PromptContext with tools (RenderToolsContext).
func (t *ChatTemplate) PromptToolsContext(ctx context.Context, tok *tokenizer.Tokenizer, msgs []Message, tools []any) (string, []int32, error) {
	prompt, err := t.RenderToolsContext(ctx, msgs, tools, true)
	if err != nil {
		return "", nil, err
	}
	if t.bos != "" && tok.Vocab().AddBOS {
		prompt = strings.TrimPrefix(prompt, t.bos)
	}
	spelled := -1 // the first message whose content spells a control token
	for i, m := range msgs {
		if tok.ControlText(m.Content) != "" {
			spelled = i
			break
		}
	}
	if spelled < 0 {
		// nothing to keep plain: one piece, exactly as llama.cpp tokenizes it
		return prompt, tok.Encode(prompt, true), nil
	}
	spans, err := t.contentSpans(ctx, prompt, msgs, tools, tok.Vocab().AddBOS)
	if errors.Is(err, ErrTemplateLimit) {
		return "", nil, err
	}
	if err != nil {
		return "", nil, fmt.Errorf("llm: message %d (%s) contains the control token %q and %w",
			spelled, msgs[spelled].Role, tok.ControlText(msgs[spelled].Content), err)
	}
	return prompt, tok.EncodeWith(prompt, tokenizer.AddSpecial(true), tokenizer.PlainSpans(spans...)), nil
}

// errContentNotFound: the template rewrites a message's content so that it cannot be located
// in the rendered prompt.
var errContentNotFound = fmt.Errorf("the chat template rewrites its content, so it cannot be kept as plain text: %w",
	core.ErrInvalidArgument)

// contentSpans locates every copy of each message's content in prompt (rendered from msgs,
// without the bos_token when trimBOS): it renders msgs again with a unique marker as each
// content, so that the template's own text, which the markers never occur in, is told apart
// from the contents whatever they contain.
func (t *ChatTemplate) contentSpans(ctx context.Context, prompt string, msgs []Message, tools []any, trimBOS bool) ([][2]int, error) {
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	tag := hex.EncodeToString(nonce[:])
	marked := make([]Message, len(msgs))
	for i, m := range msgs {
		// letters and digits only: no filter a template applies to a content (trim, escape)
		// changes it
		marked[i] = Message{Role: m.Role, Content: fmt.Sprintf("XPU%sM%dX", tag, i), ToolCalls: m.ToolCalls, ToolCallID: m.ToolCallID}
	}
	skel, err := t.RenderToolsContext(ctx, marked, tools, true)
	if errors.Is(err, ErrTemplateLimit) {
		return nil, err
	}
	if err != nil {
		return nil, errContentNotFound
	}
	if t.bos != "" && trimBOS {
		skel = strings.TrimPrefix(skel, t.bos)
	}
	marker := regexp.MustCompile("XPU" + tag + "M([0-9]+)X")
	locs := marker.FindAllStringSubmatchIndex(skel, -1)
	// skel is lit[0] marker lit[1] marker ... lit[n]; prompt must be lit[0] content lit[1] ...
	var spans [][2]int
	p, prev := 0, 0
	for j, loc := range locs {
		lit := skel[prev:loc[0]]
		if !strings.HasPrefix(prompt[p:], lit) {
			return nil, errContentNotFound
		}
		p += len(lit)
		i, err := strconv.Atoi(skel[loc[2]:loc[3]])
		if err != nil || i >= len(msgs) {
			return nil, errContentNotFound
		}
		next := skel[loc[1]:]
		if j+1 < len(locs) {
			next = skel[loc[1]:locs[j+1][0]]
		}
		c := msgs[i].Content
		found := false
		// the content as written, or trimmed as templates do with | trim and .strip()
		for _, cand := range []string{c, strings.TrimSpace(c), strings.TrimLeftFunc(c, unicode.IsSpace), strings.TrimRightFunc(c, unicode.IsSpace)} {
			if strings.HasPrefix(prompt[p:], cand+next) {
				spans = append(spans, [2]int{p, p + len(cand)})
				p += len(cand)
				found = true
				break
			}
		}
		if !found {
			return nil, errContentNotFound
		}
		prev = loc[1]
	}
	if prompt[p:] != skel[prev:] {
		return nil, errContentNotFound
	}
	return spans, nil
}

func (c *Chat) complete(ctx context.Context, msgs []Message, tools []any, opts ...GenerateOption) (Result, error) {
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
