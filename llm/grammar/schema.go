package grammar

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// ErrSchema wraps every error of a JSON Schema the converter cannot turn into a grammar.
var ErrSchema = errors.New("grammar: json schema")

// maxCount bounds minItems, maxItems, minLength and maxLength: each counted item is a copy of
// its rule in the grammar.
const maxCount = 1000

// maxSchemaRules bounds the grammar a schema expands to.
const maxSchemaRules = 5000

// unsupported are the keywords that constrain values in ways the converter does not
// implement: refused, since ignoring them would let through what the schema forbids.
var unsupported = []string{
	"pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "not",
	"if", "then", "else", "patternProperties", "uniqueItems", "minProperties", "maxProperties",
	"contains", "minContains", "maxContains", "prefixItems", "dependentRequired", "dependentSchemas",
	"propertyNames", "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef",
}

// FromSchema compiles a JSON Schema (draft 2020-12 subset: type, properties, required,
// additionalProperties, items, minItems, maxItems, minLength, maxLength, enum, const, anyOf,
// oneOf (as anyOf), a one-element allOf, $ref to #/$defs or #/definitions) into a grammar of
// the JSON texts it accepts. Annotations (title, description, format, default, examples) are
// ignored; constraints it cannot express (pattern, minimum ...) are refused with ErrSchema.
// Properties come in the schema's order, required ones always, optional ones when the model
// writes them; additionalProperties defaults to none, as llama.cpp's converter does.
func FromSchema(schema []byte) (*Grammar, error) {
	src, err := SchemaGBNF(schema)
	if err != nil {
		return nil, err
	}
	g, err := Parse(src)
	if err != nil {
		return nil, fmt.Errorf("%w: the generated grammar does not compile: %w", ErrSchema, err)
	}
	return g, nil
}

// SchemaGBNF converts a JSON Schema to GBNF text (see FromSchema).
func SchemaGBNF(schema []byte) (string, error) {
	root, err := parseOrdered(schema)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrSchema, err)
	}
	c := &converter{root: root, rules: map[string]string{}, refs: map[string]string{},
		names: map[string]bool{"root": true}}
	expr, err := c.visit(root, "root", "#")
	if err != nil {
		return "", err
	}
	c.rules["root"] = expr
	c.order = append(c.order, "root")
	var b strings.Builder
	// root first, then the schema's rules, then the primitives they use
	names := slices.Clone(c.order)
	slices.SortStableFunc(names, func(a, b string) int {
		if a == "root" {
			return -1
		}
		if b == "root" {
			return 1
		}
		return 0
	})
	for _, n := range names {
		fmt.Fprintf(&b, "%s ::= %s\n", n, c.rules[n])
	}
	var prims []string
	for p := range c.prims {
		prims = append(prims, p)
	}
	slices.Sort(prims)
	for _, p := range prims {
		fmt.Fprintf(&b, "%s ::= %s\n", p, primitives[p])
	}
	return b.String(), nil
}

// omap is a JSON object that keeps its keys' order (properties come in the schema's order).
type omap struct {
	keys []string
	vals map[string]any
}

func (m *omap) get(k string) (any, bool) {
	v, ok := m.vals[k]
	return v, ok
}

// parseOrdered decodes JSON keeping objects' key order; numbers stay json.Number.
func parseOrdered(data []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	v, err := decodeValue(d)
	if err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, errors.New("trailing data after the schema")
	}
	return v, nil
}

func decodeValue(d *json.Decoder) (any, error) {
	t, err := d.Token()
	if err != nil {
		return nil, fmt.Errorf("not valid JSON: %w", err)
	}
	switch t := t.(type) {
	case json.Delim:
		switch t {
		case '{':
			m := &omap{vals: map[string]any{}}
			for d.More() {
				kt, err := d.Token()
				if err != nil {
					return nil, fmt.Errorf("not valid JSON: %w", err)
				}
				k, _ := kt.(string)
				v, err := decodeValue(d)
				if err != nil {
					return nil, err
				}
				if _, dup := m.vals[k]; !dup {
					m.keys = append(m.keys, k)
				}
				m.vals[k] = v
			}
			if _, err := d.Token(); err != nil {
				return nil, fmt.Errorf("not valid JSON: %w", err)
			}
			return m, nil
		case '[':
			var a []any
			for d.More() {
				v, err := decodeValue(d)
				if err != nil {
					return nil, err
				}
				a = append(a, v)
			}
			if _, err := d.Token(); err != nil {
				return nil, fmt.Errorf("not valid JSON: %w", err)
			}
			if a == nil {
				a = []any{}
			}
			return a, nil
		}
		return nil, fmt.Errorf("not valid JSON: unexpected %v", t)
	default:
		return t, nil
	}
}

// marshalOrdered writes v as compact JSON, objects in their order.
func marshalOrdered(v any) string {
	switch v := v.(type) {
	case *omap:
		var b strings.Builder
		b.WriteByte('{')
		for i, k := range v.keys {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(jsonText(k))
			b.WriteByte(':')
			b.WriteString(marshalOrdered(v.vals[k]))
		}
		b.WriteByte('}')
		return b.String()
	case []any:
		var parts []string
		for _, x := range v {
			parts = append(parts, marshalOrdered(x))
		}
		return "[" + strings.Join(parts, ",") + "]"
	case json.Number:
		return v.String()
	default:
		return jsonText(v)
	}
}

// jsonText is v as compact JSON, without encoding/json's HTML escapes (a model writes "<" as
// itself, not as \u003c).
func jsonText(v any) string {
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	_ = e.Encode(v)
	return strings.TrimSuffix(b.String(), "\n")
}

type converter struct {
	root  any
	rules map[string]string
	order []string
	refs  map[string]string // $ref -> rule name
	names map[string]bool
	prims map[string]bool
}

func (c *converter) errf(path, format string, args ...any) error {
	return fmt.Errorf("%w: at %s: %s", ErrSchema, path, fmt.Sprintf(format, args...))
}

// prim returns a primitive's name, adding it and what it uses.
func (c *converter) prim(name string) string {
	if c.prims == nil {
		c.prims = map[string]bool{}
	}
	if !c.prims[name] {
		c.prims[name] = true
		for _, d := range primitiveDeps[name] {
			c.prim(d)
		}
	}
	return name
}

// name returns a fresh rule name derived from hint.
func (c *converter) name(hint string) string {
	var b strings.Builder
	for _, r := range hint {
		if r < 128 && isWordByte(byte(r)) && r != '_' {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	base := strings.Trim(b.String(), "-")
	if base == "" {
		base = "r"
	}
	if _, isPrim := primitives[base]; isPrim {
		base += "-"
	}
	n := base
	for i := 1; c.names[n]; i++ {
		n = base + "-" + strconv.Itoa(i)
	}
	c.names[n] = true
	return n
}

// add defines a rule and returns its name.
func (c *converter) add(name, body string) (string, error) {
	if len(c.order) >= maxSchemaRules {
		return "", fmt.Errorf("%w: the schema expands to more than %d rules", ErrSchema, maxSchemaRules)
	}
	c.rules[name] = body
	c.order = append(c.order, name)
	return name, nil
}

// visit returns a GBNF expression (usually one rule name) for schema s.
func (c *converter) visit(s any, hint, path string) (string, error) {
	switch s := s.(type) {
	case bool:
		if !s {
			return "", c.errf(path, "the schema false matches nothing")
		}
		return c.prim("value"), nil
	case *omap:
		return c.visitObject(s, hint, path)
	}
	return "", c.errf(path, "a schema must be an object or a boolean, not %s", marshalOrdered(s))
}

func (c *converter) visitObject(s *omap, hint, path string) (string, error) {
	for _, k := range unsupported {
		if _, ok := s.get(k); ok {
			return "", c.errf(path, "keyword %q is not supported", k)
		}
	}
	if ref, ok := s.get("$ref"); ok {
		r, ok := ref.(string)
		if !ok {
			return "", c.errf(path, "$ref must be a string")
		}
		return c.ref(r, path)
	}
	if all, ok := s.get("allOf"); ok {
		list, ok := all.([]any)
		if !ok || len(list) != 1 {
			return "", c.errf(path, "allOf is supported with one schema only")
		}
		return c.visit(list[0], hint, path+"/allOf/0")
	}
	if v, ok := s.get("const"); ok {
		return c.add(c.name(hint), quote(marshalOrdered(v))+" "+c.prim("space"))
	}
	if v, ok := s.get("enum"); ok {
		list, ok := v.([]any)
		if !ok || len(list) == 0 {
			return "", c.errf(path+"/enum", "enum must be a non-empty array")
		}
		var alts []string
		for _, x := range list {
			alts = append(alts, quote(marshalOrdered(x)))
		}
		return c.add(c.name(hint), "("+strings.Join(alts, " | ")+") "+c.prim("space"))
	}
	for _, kw := range []string{"anyOf", "oneOf"} {
		v, ok := s.get(kw)
		if !ok {
			continue
		}
		list, ok := v.([]any)
		if !ok || len(list) == 0 {
			return "", c.errf(path+"/"+kw, "%s must be a non-empty array", kw)
		}
		var alts []string
		for i, sub := range list {
			e, err := c.visit(sub, fmt.Sprintf("%s-%d", hint, i), fmt.Sprintf("%s/%s/%d", path, kw, i))
			if err != nil {
				return "", err
			}
			alts = append(alts, e)
		}
		return c.add(c.name(hint), strings.Join(alts, " | "))
	}
	var types []string
	switch t := s.vals["type"].(type) {
	case nil:
		switch {
		case has(s, "properties") || has(s, "additionalProperties") || has(s, "required"):
			types = []string{"object"}
		case has(s, "items") || has(s, "minItems") || has(s, "maxItems"):
			types = []string{"array"}
		case has(s, "minLength") || has(s, "maxLength"):
			types = []string{"string"}
		default:
			return c.prim("value"), nil
		}
	case string:
		types = []string{t}
	case []any:
		for _, x := range t {
			str, ok := x.(string)
			if !ok {
				return "", c.errf(path+"/type", "type must be a string or an array of strings")
			}
			types = append(types, str)
		}
		if len(types) == 0 {
			return "", c.errf(path+"/type", "an empty type array matches nothing")
		}
	default:
		return "", c.errf(path+"/type", "type must be a string or an array of strings")
	}
	var alts []string
	for _, t := range types {
		e, err := c.typed(s, t, hint, path)
		if err != nil {
			return "", err
		}
		alts = append(alts, e)
	}
	if len(alts) == 1 {
		return alts[0], nil
	}
	return c.add(c.name(hint), strings.Join(alts, " | "))
}

func has(s *omap, k string) bool { _, ok := s.get(k); return ok }

// count reads a non-negative integer keyword; ok is false when absent.
func (c *converter) count(s *omap, k, path string) (int, bool, error) {
	v, ok := s.get(k)
	if !ok {
		return 0, false, nil
	}
	n, isNum := v.(json.Number)
	if !isNum {
		return 0, false, c.errf(path+"/"+k, "%s must be a number", k)
	}
	i, err := strconv.ParseInt(n.String(), 10, 64)
	if err != nil || i < 0 {
		if f, ferr := n.Float64(); ferr == nil && f >= 0 && f == float64(int64(f)) {
			i, err = int64(f), nil
		} else {
			return 0, false, c.errf(path+"/"+k, "%s %s: must be a non-negative integer", k, n)
		}
	}
	if i > maxCount {
		return 0, false, c.errf(path+"/"+k, "%s %d: at most %d is supported", k, i, maxCount)
	}
	return int(i), true, nil
}

// repeat writes x repeated between mn and mx times (mx < 0: no bound), items separated by sep.
func repeatExpr(x, sep string, mn, mx int) string {
	if mx == 0 {
		return ""
	}
	rest := func(lo, hi int) string {
		if hi < 0 {
			return fmt.Sprintf("(%s %s){%d,}", sep, x, lo)
		}
		if hi == 0 {
			return ""
		}
		if lo == hi {
			return fmt.Sprintf("(%s %s){%d}", sep, x, lo)
		}
		return fmt.Sprintf("(%s %s){%d,%d}", sep, x, lo, hi)
	}
	if sep == "" {
		switch {
		case mx < 0:
			return fmt.Sprintf("%s{%d,}", x, mn)
		case mn == mx:
			return fmt.Sprintf("%s{%d}", x, mn)
		}
		return fmt.Sprintf("%s{%d,%d}", x, mn, mx)
	}
	hi := -1
	if mx >= 0 {
		hi = mx - 1
	}
	body := strings.TrimSpace(x + " " + rest(max(mn-1, 0), hi))
	if mn == 0 {
		return "(" + body + ")?"
	}
	return body
}

func (c *converter) typed(s *omap, t, hint, path string) (string, error) {
	switch t {
	case "null", "boolean", "number", "integer":
		return c.prim(t), nil
	case "string":
		mn, _, err := c.count(s, "minLength", path)
		if err != nil {
			return "", err
		}
		mx, hasMax, err := c.count(s, "maxLength", path)
		if err != nil {
			return "", err
		}
		if !hasMax {
			mx = -1
		}
		if mn == 0 && mx < 0 {
			return c.prim("string"), nil
		}
		if mx >= 0 && mx < mn {
			return "", c.errf(path, "maxLength %d is below minLength %d", mx, mn)
		}
		c.prim("char")
		return c.add(c.name(hint), `"\"" `+repeatExpr("char", "", mn, mx)+` "\"" `+c.prim("space"))
	case "array":
		item := c.prim("value")
		if it, ok := s.get("items"); ok {
			var err error
			if item, err = c.visit(it, hint+"-item", path+"/items"); err != nil {
				return "", err
			}
		}
		mn, _, err := c.count(s, "minItems", path)
		if err != nil {
			return "", err
		}
		mx, hasMax, err := c.count(s, "maxItems", path)
		if err != nil {
			return "", err
		}
		if !hasMax {
			mx = -1
		}
		if mx >= 0 && mx < mn {
			return "", c.errf(path, "maxItems %d is below minItems %d", mx, mn)
		}
		sp := c.prim("space")
		return c.add(c.name(hint), fmt.Sprintf(`"[" %s %s "]" %s`, sp, repeatExpr(item, `"," `+sp, mn, mx), sp))
	case "object":
		return c.object(s, hint, path)
	}
	return "", c.errf(path+"/type", "unknown type %q", t)
}

func (c *converter) object(s *omap, hint, path string) (string, error) {
	sp := c.prim("space")
	props, _ := s.vals["properties"].(*omap)
	if _, ok := s.get("properties"); ok && props == nil {
		return "", c.errf(path+"/properties", "properties must be an object")
	}
	if props == nil {
		props = &omap{vals: map[string]any{}}
	}
	required := map[string]bool{}
	var reqOrder []string
	if v, ok := s.get("required"); ok {
		list, ok := v.([]any)
		if !ok {
			return "", c.errf(path+"/required", "required must be an array of strings")
		}
		for _, x := range list {
			k, ok := x.(string)
			if !ok {
				return "", c.errf(path+"/required", "required must be an array of strings")
			}
			if !required[k] {
				required[k] = true
				reqOrder = append(reqOrder, k)
			}
		}
	}
	// required names missing from properties take any value
	for _, k := range reqOrder {
		if _, ok := props.get(k); !ok {
			props.keys = append(props.keys, k)
			props.vals[k] = true
		}
	}
	var extra string // the value of additional properties, "" when none are allowed
	if ap, ok := s.get("additionalProperties"); ok {
		switch ap := ap.(type) {
		case bool:
			if ap {
				extra = c.prim("value")
			}
		case *omap:
			var err error
			if extra, err = c.visit(ap, hint+"-additional", path+"/additionalProperties"); err != nil {
				return "", err
			}
		default:
			return "", c.errf(path+"/additionalProperties", "additionalProperties must be a boolean or a schema")
		}
	} else if len(props.keys) == 0 {
		extra = c.prim("value") // {"type":"object"}: any object
	}
	kv := map[string]string{}
	for _, k := range props.keys {
		val, err := c.visit(props.vals[k], hint+"-"+k, path+"/properties/"+k)
		if err != nil {
			return "", err
		}
		key := jsonText(k)
		name, err := c.add(c.name(hint+"-"+k+"-kv"), fmt.Sprintf("%s %s \":\" %s %s", quote(key), sp, sp, val))
		if err != nil {
			return "", err
		}
		kv[k] = name
	}
	var req, opt []string
	for _, k := range props.keys {
		if required[k] {
			req = append(req, kv[k])
		} else {
			opt = append(opt, kv[k])
		}
	}
	extraKV := ""
	if extra != "" {
		c.prim("string")
		var err error
		key := "string"
		if len(props.keys) > 0 {
			// an additional key must differ from the listed ones, or a duplicate would override
			// a listed property's value with one of another schema
			if key, err = c.otherKey(props.keys, hint); err != nil {
				return "", err
			}
		}
		if extraKV, err = c.add(c.name(hint+"-additional-kv"), fmt.Sprintf("%s \":\" %s %s", key, sp, extra)); err != nil {
			return "", err
		}
	}
	// tail[i]: what may follow once the optional properties before i are decided
	tail := make([]string, len(opt)+1)
	if extraKV != "" {
		tail[len(opt)] = fmt.Sprintf(`("," %s %s)*`, sp, extraKV)
	}
	for i := len(opt) - 1; i >= 0; i-- {
		body := strings.TrimSpace(fmt.Sprintf(`("," %s %s)? %s`, sp, opt[i], tail[i+1]))
		name, err := c.add(c.name(hint+"-rest"), body)
		if err != nil {
			return "", err
		}
		tail[i] = name
	}
	var inner string
	if len(req) > 0 {
		inner = strings.Join(req, ` "," `+sp+" ") + " " + tail[0]
	} else {
		var firsts []string
		for i, o := range opt {
			firsts = append(firsts, strings.TrimSpace(o+" "+tail[i+1]))
		}
		if extraKV != "" {
			firsts = append(firsts, strings.TrimSpace(extraKV+" "+tail[len(opt)]))
		}
		if len(firsts) > 0 {
			inner = "(" + strings.Join(firsts, " | ") + ")?"
		}
	}
	return c.add(c.name(hint), strings.TrimSpace(fmt.Sprintf(`"{" %s %s "}" %s`, sp, strings.TrimSpace(inner), sp)))
}

// ref resolves a local $ref ("#", "#/$defs/x", "#/definitions/x", or any JSON pointer into the
// root schema) to a rule, defining it on first use (recursive schemas refer to themselves).
func (c *converter) ref(r, path string) (string, error) {
	if name, ok := c.refs[r]; ok {
		return name, nil
	}
	if !strings.HasPrefix(r, "#") {
		return "", c.errf(path, "$ref %q: only references inside the schema (#/...) are supported", r)
	}
	target := c.root
	if p := strings.TrimPrefix(r, "#"); p != "" {
		if !strings.HasPrefix(p, "/") {
			return "", c.errf(path, "$ref %q: not a JSON pointer", r)
		}
		for _, tok := range strings.Split(p[1:], "/") {
			tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
			switch t := target.(type) {
			case *omap:
				v, ok := t.get(tok)
				if !ok {
					return "", c.errf(path, "$ref %q: %q not found", r, tok)
				}
				target = v
			case []any:
				i, err := strconv.Atoi(tok)
				if err != nil || i < 0 || i >= len(t) {
					return "", c.errf(path, "$ref %q: %q not found", r, tok)
				}
				target = t[i]
			default:
				return "", c.errf(path, "$ref %q: %q not found", r, tok)
			}
		}
	}
	hint := "ref" + strings.NewReplacer("/$defs/", "-", "/definitions/", "-", "/", "-").Replace(strings.TrimPrefix(r, "#"))
	name := c.name(hint)
	c.refs[r] = name
	c.rules[name] = "" // reserved: a reference back to it while visiting resolves to the name
	c.order = append(c.order, name)
	expr, err := c.visit(target, hint+"-body", r)
	if err != nil {
		return "", err
	}
	c.rules[name] = expr
	return name, nil
}

// otherKey is a rule for the JSON strings other than keys: a trie of the keys' characters where
// every node may branch off to any other character (and may end unless a key ends there).
func (c *converter) otherKey(keys []string, hint string) (string, error) {
	type trie struct {
		kids  map[rune]*trie
		order []rune
		end   bool
	}
	root := &trie{kids: map[rune]*trie{}}
	for _, k := range keys {
		n := root
		for _, r := range k {
			if n.kids[r] == nil {
				n.kids[r] = &trie{kids: map[rune]*trie{}}
				n.order = append(n.order, r)
			}
			n = n.kids[r]
		}
		n.end = true
	}
	c.prim("char")
	var build func(n *trie) (string, error)
	build = func(n *trie) (string, error) {
		var alts []string
		excl := `"\\\x7F\x00-\x1F`
		for _, r := range n.order {
			sub, err := build(n.kids[r])
			if err != nil {
				return "", err
			}
			lit := quote(string(r))
			alts = append(alts, lit+" "+sub)
			cls := lit[1 : len(lit)-1]
			if cls == "]" || cls == "^" || cls == "-" || cls == "[" {
				cls = "\\" + cls
			}
			excl += cls
		}
		// another character (or an escape, which never spells a key's plain character), then anything
		alts = append(alts, "([^"+excl+"] | [\\\\] ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})) char*")
		if !n.end {
			alts = append(alts, `""`)
		}
		return c.add(c.name(hint+"-other-key"), strings.Join(alts, " | "))
	}
	body, err := build(root)
	if err != nil {
		return "", err
	}
	return c.add(c.name(hint+"-additional-key"), `"\"" `+body+` "\"" `+c.prim("space"))
}
