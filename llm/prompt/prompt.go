// Package prompt renders a conversation into the prompt text a model was trained on, through
// the model's Jinja chat template (tokenizer.chat_template) within limits, since a template in a
// model file is untrusted input; and into the tokens a runner is fed, with every message's
// content kept as plain text whatever control tokens it spells.
package prompt

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/internal/jinja"
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

// Fallback renders conversations for models whose GGUF file has no
// tokenizer.chat_template (base models such as stories260K): the system prompt as a
// paragraph, then "User: ..." and "Assistant: ..." lines, ending with "Assistant:" when a reply
// is wanted (a reply, which the model starts with a space, is written back trimmed, so that
// the next turn's text extends the cached one). FallbackStops ends a reply where the model starts the user's next line.
const Fallback = `{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}

{% elif m.role == 'user' %}User: {{ m.content }}
{% else %}Assistant: {{ m.content | trim }}
{% endif %}{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}`

// FallbackStops are the stop strings that go with Fallback.
var FallbackStops = []string{"\nUser:"}

// Template renders a conversation into the prompt text a model was trained on. It is safe
// for concurrent use.
type Template struct {
	tmpl     *jinja.Template
	fallback bool
	bos, eos string
}

// ErrLimit is wrapped by the errors of a chat template that broke a rendering limit
// (TemplateLimits, or its time): a chat template comes from the model file, so it is untrusted
// input, and one that recurses, builds huge text or loops for long is stopped, never left to
// crash or hang the process.
var ErrLimit = jinja.ErrLimit

// templateLimits bound every render of a chat template: macro calls nest at most 64 deep
// (recursion), it builds at most 64 MiB and runs at most ten million steps (nodes and loop
// iterations), each far above what real templates need. A render also stops when its context
// ends, and after Timeout at most.
var templateLimits = jinja.Limits{MaxDepth: 64, MaxBytes: 64 << 20, MaxSteps: 10_000_000}

// Timeout bounds one render of a chat template whatever its context.
const Timeout = 5 * time.Second

// maxTemplateBytes bounds a chat template's source (real ones are a few KiB).
const maxTemplateBytes = 1 << 20

// loadCheckTimeout bounds the trial render New makes.
const loadCheckTimeout = time.Second

// New compiles a Jinja chat template (as found in tokenizer.chat_template) for the tokenizer
// tok (whose BOS and EOS texts it receives as bos_token and eos_token). It renders a
// short conversation once, so that a template that breaks the rendering limits on any input
// (ErrLimit) is refused here rather than on every request.
func New(tok *tokenizer.Tokenizer, src string) (*Template, error) {
	if len(src) > maxTemplateBytes {
		return nil, fmt.Errorf("prompt: chat template of %d bytes, more than %d: %w: %w", len(src), maxTemplateBytes,
			ErrLimit, core.ErrInvalidArgument)
	}
	t, err := jinja.Compile(src)
	if err != nil {
		return nil, fmt.Errorf("prompt: chat template: %w: %w", err, core.ErrInvalidArgument)
	}
	ct := &Template{tmpl: t}
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
	if _, err := ct.RenderContext(ctx, trial, true); errors.Is(err, ErrLimit) {
		return nil, fmt.Errorf("prompt: chat template: rendering a four-message conversation: %w", err)
	}
	return ct, nil
}

// NewFallback is New with Fallback, marked as such (IsFallback): for a model whose file has no
// template of its own.
func NewFallback(tok *tokenizer.Tokenizer) (*Template, error) {
	t, err := New(tok, Fallback)
	if err != nil {
		return nil, err
	}
	t.fallback = true
	return t, nil
}

// IsFallback says the model has no template of its own and Fallback is used.
func (t *Template) IsFallback() bool { return t.fallback }

// Render renders msgs; with addGenerationPrompt the text ends where the assistant's reply
// begins. It is RenderContext without a context of its own.
func (t *Template) Render(msgs []Message, addGenerationPrompt bool) (string, error) {
	return t.RenderContext(context.Background(), msgs, addGenerationPrompt)
}

// RenderContext is Render within the rendering limits (ErrLimit), stopped when ctx ends or after
// Timeout: the error then wraps ErrLimit (and ctx's cause).
func (t *Template) RenderContext(ctx context.Context, msgs []Message, addGenerationPrompt bool) (string, error) {
	return t.RenderToolsContext(ctx, msgs, nil, addGenerationPrompt)
}

// RenderToolsContext is RenderContext with the tools the model may call, given to the template
// as Hugging Face's apply_chat_template gives them (the OpenAI request's "tools": a list of
// {"type": "function", "function": {"name", "description", "parameters"}}); nil gives none.
func (t *Template) RenderToolsContext(ctx context.Context, msgs []Message, tools []any, addGenerationPrompt bool) (string, error) {
	list := make([]any, len(msgs))
	for i, m := range msgs {
		list[i] = m.templateValue()
	}
	ctx, cancel := context.WithTimeout(ctx, Timeout)
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
		return "", fmt.Errorf("prompt: render chat template: %w: %w", err, core.ErrInvalidArgument)
	}
	return out, nil
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
func (t *Template) Prompt(tok *tokenizer.Tokenizer, msgs []Message) (string, []int32, error) {
	return t.PromptContext(context.Background(), tok, msgs)
}

// PromptContext is Prompt with the rendering bound to ctx (RenderContext).
func (t *Template) PromptContext(ctx context.Context, tok *tokenizer.Tokenizer, msgs []Message) (string, []int32, error) {
	return t.PromptToolsContext(ctx, tok, msgs, nil)
}

// PromptToolsContext is PromptContext with tools (RenderToolsContext).
func (t *Template) PromptToolsContext(ctx context.Context, tok *tokenizer.Tokenizer, msgs []Message, tools []any) (string, []int32, error) {
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
	if errors.Is(err, ErrLimit) {
		return "", nil, err
	}
	if err != nil {
		return "", nil, fmt.Errorf("prompt: message %d (%s) contains the control token %q and %w",
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
func (t *Template) contentSpans(ctx context.Context, prompt string, msgs []Message, tools []any, trimBOS bool) ([][2]int, error) {
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
	if errors.Is(err, ErrLimit) {
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
