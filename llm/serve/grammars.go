package serve

import (
	"sync"

	"github.com/xpuhub/xpu/llm/grammar"
)

// maxCachedGrammars bounds the compiled json_schema grammars a server keeps.
const maxCachedGrammars = 32

// grammarCache keeps the grammars of recent json_schema requests by schema text: an app that
// sends the same schema every time gets the grammar, and the token masks its earlier answers
// computed, without compiling it again.
type grammarCache struct {
	mu    sync.Mutex
	byKey map[string]*grammar.Grammar
	order []string // oldest first
}

func (c *grammarCache) get(schema []byte) (*grammar.Grammar, error) {
	key := string(schema)
	c.mu.Lock()
	g := c.byKey[key]
	c.mu.Unlock()
	if g != nil {
		return g, nil
	}
	g, err := grammar.FromSchema(schema)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byKey == nil {
		c.byKey = map[string]*grammar.Grammar{}
	}
	if _, ok := c.byKey[key]; !ok {
		if len(c.order) >= maxCachedGrammars {
			delete(c.byKey, c.order[0])
			c.order = c.order[1:]
		}
		c.byKey[key] = g
		c.order = append(c.order, key)
	}
	return g, nil
}

// responseGrammar compiles response_format into the grammar generation is held to (nil for
// text).
func (c *grammarCache) responseGrammar(f *responseFormat) (*grammar.Grammar, *apiError) {
	if f == nil {
		return nil, nil
	}
	switch f.Type {
	case "", "text":
		return nil, nil
	case "json_object":
		return grammar.JSON(), nil
	case "json_schema":
		if f.JSONSchema == nil || len(f.JSONSchema.Schema) == 0 || string(f.JSONSchema.Schema) == "null" {
			return nil, badRequest("response_format.json_schema.schema", "invalid_value",
				"response_format json_schema needs json_schema.schema")
		}
		g, err := c.get(f.JSONSchema.Schema)
		if err != nil {
			name := f.JSONSchema.Name
			if name == "" {
				name = "(unnamed)"
			}
			return nil, badRequest("response_format.json_schema.schema", "invalid_value",
				"response_format json_schema %s: %v", name, err)
		}
		return g, nil
	}
	return nil, badRequest("response_format", "unsupported_value",
		"response_format %q is not supported (text, json_object or json_schema)", f.Type)
}
